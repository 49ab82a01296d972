"""What capture writes: call sites, strict JSON, meta.json, and dumps that survive a crash."""
from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import torch
import torch.nn as nn

import opdiff
from opdiff.store import find_dumps, iter_tensors, layout, open_dump

HERE = os.path.abspath(__file__)


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    raise AssertionError(text)


def _user_helper(x):
    return torch.tanh(x)   # call site inside a helper


def _program(x):
    y = _user_helper(x)
    for _ in range(3):
        y = y.exp()        # one line, three calls
    return y


def test_call_sites_are_the_users_frames(dump_root, read_dump):
    with opdiff.dump(None, dump_root, level="L1"):
        _program(torch.randn(3))
    dump = read_dump(dump_root)
    tanh = dump.dump.stack(dump["Torch.tanh.0.forward"]["stack"])
    assert tanh[0]["file"] == HERE
    assert tanh[0]["function"] == "_user_helper"
    assert tanh[0]["line"] == _line_of(_user_helper, "torch.tanh(x)")
    assert tanh[0]["code"] == "return torch.tanh(x)   # call site inside a helper"
    # The caller frames follow, innermost first; no frame is torch's or opdiff's own.
    assert [f["function"] for f in tanh[:3]] == ["_user_helper", "_program", "test_call_sites_are_the_users_frames"]
    torch_dir = os.path.dirname(torch.__file__)
    opdiff_dir = os.path.dirname(opdiff.__file__)
    for frames in dump.dump.stacks().values():
        for f in frames:
            assert not f["file"].startswith((torch_dir, opdiff_dir)), f


def test_a_call_site_is_stored_once(dump_root, read_dump, strict_lines):
    x = torch.randn(3)
    with opdiff.dump(None, dump_root, level="L1"):
        _program(x)
    dump = read_dump(dump_root)
    exp_ids = {dump[f"Tensor.exp.{i}.forward"]["stack"] for i in range(3)}
    assert len(exp_ids) == 1
    entries = strict_lines(dump.dir / layout.STACKS)
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)) == 2           # the tanh line and the exp line
    frames = [json.dumps(e["frames"], sort_keys=True) for e in entries]
    assert len(set(frames)) == len(frames)


def test_module_call_site_is_where_the_user_called_the_model(dump_root, read_dump):
    model = nn.Sequential(nn.Linear(2, 2))
    with opdiff.dump(model, dump_root, level="L0"):
        out = model(torch.ones(1, 2))  # the model call
    dump = read_dump(dump_root)
    frames = dump.dump.stack(dump["Module.0.Linear.forward.0"]["stack"])
    assert frames[0]["file"] == HERE
    assert frames[0]["code"] == "out = model(torch.ones(1, 2))  # the model call"


def test_records_are_strict_json_with_non_finite_numbers(dump_root, read_dump):
    x = torch.tensor([1.0, float("inf"), float("nan"), -float("inf")])
    with opdiff.dump(None, dump_root, level="L1"):
        y = torch.clamp(x, min=float("-inf"), max=float("inf")) * float("nan")
    dump = read_dump(dump_root)                      # strict parse inside
    raw = (dump.dir / layout.RECORDS).read_text()
    assert "NaN," not in raw.replace('"NaN"', "") and "Infinity" not in raw.replace('"Infinity"', "").replace('"-Infinity"', "")
    stats = dump["Torch.clamp.0.forward"]["inputs"][0]["stats"]
    assert stats["nan"] == 1 and stats["inf"] == 2


def test_record_encoder_agrees_with_the_standard_library(monkeypatch):
    from opdiff.store import records
    record = {"name": "Tensor.add.0.forward", "seq": 3, "module": None, "flag": True,
              "inputs": [{"type": "float", "value": 1e-05}, {"type": "float", "value": -0.1},
                         {"type": "str", "value": "é ünïcode \"quoted\"\n"},
                         {"type": "float", "value": records.encode_float(float("nan"))}],
              "big": 2 ** 70}                        # beyond 64 bits: orjson refuses it
    line = records.dumps(record)
    assert "\n" not in line and json.loads(line) == record
    monkeypatch.setattr(records, "_orjson", None)   # installed without dependencies
    assert json.loads(records.dumps(record)) == record


def test_meta_holds_format_version_config_and_environment(dump_root, read_dump):
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        torch.ones(2).exp()
    meta = read_dump(dump_root).meta
    assert meta["format_version"] == layout.FORMAT_VERSION
    assert meta["opdiff_version"] == opdiff.__version__
    assert meta["config"]["level"] == "L1" and meta["config"]["task"] == "tensor"
    env = meta["environment"]
    assert env["torch"] == torch.__version__
    assert env["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert env["torch_threads"] == torch.get_num_threads()


def test_reader_tolerates_a_truncated_last_line(dump_root, tmp_path):
    x = torch.ones(2)
    with opdiff.dump(None, dump_root, level="L1"):
        for _ in range(5):
            x.exp()
    src = layout.rank_dir(dump_root, 0, 0)
    cut = tmp_path / "cut" / "step0" / "rank0"
    shutil.copytree(src, cut)
    data = (cut / layout.RECORDS).read_bytes()
    (cut / layout.RECORDS).write_bytes(data[:-25])    # half of the last line, as a crash leaves it
    full = list(open_dump(src).records())
    partial = list(open_dump(cut).records())
    assert len(full) == 5
    assert partial == full[:4]


_CHILD = textwrap.dedent("""
    import os, signal, sys
    import torch, torch.nn as nn, opdiff
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    dbg = opdiff.PrecisionDebugger(dump_path=sys.argv[1], task="tensor", level="mix")
    x = torch.randn(4, 8)
    dbg.start(model)
    for _ in range(40):
        model(x).sum().backward()
    dbg.stop()                        # flushes everything recorded so far
    print(len(open(os.path.join(dbg.dump_dir, "records.jsonl")).read().splitlines()), flush=True)
    dbg.start(model)
    for i in range(10 ** 6):          # keeps recording until the parent kills it
        model(x).sum().backward()
        if i == 30:
            print("running", flush=True)
""")


def test_a_killed_run_leaves_a_readable_dump(dump_root, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(dump_root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        flushed = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    (directory,) = find_dumps(dump_root)
    dump = open_dump(directory)
    records = list(dump.records())
    assert len(records) >= flushed > 100
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert records[0]["name"] == "Input.0.0.forward"     # the root call's input, then its first op
    assert records[1]["name"] == "Parameter.0.weight.0.forward"
    assert records[1]["reader"] == "Functional.linear.0.forward"
    stacks = dump.stacks()
    assert all(r["stack"] in stacks for r in records if r.get("stack") is not None)
    # Tensors: every record flushed before the kill has its tensors on disk too.
    keys = set(dump.tensor_keys())
    missing = [name for r in records[:flushed] for name, _role, desc in iter_tensors(r)
               if desc.get("key") not in keys]
    assert not missing, f"{len(missing)} tensors of flushed records are not on disk, e.g. {missing[0]}"


def test_model_code_installed_in_site_packages_is_a_user_frame(dump_root, read_dump):
    # Model libraries (transformers, timm, a user's own installed package) live in
    # site-packages, which sits inside the stdlib directory on most installs: their lines are
    # the call sites users need ("modeling_bert.py:412 attn = torch.matmul(q, k)").
    import sysconfig
    fake = os.path.join(sysconfig.get_paths()["purelib"], "fakemodels", "modeling_fake.py")
    namespace = {"torch": torch}
    exec(compile("def attention(q, k):\n    return torch.matmul(q, k)\n", fake, "exec"), namespace)
    q, k = torch.randn(2, 3), torch.randn(3, 2)
    with opdiff.dump(None, dump_root, level="L1"):
        namespace["attention"](q, k)  # called from the test
    dump = read_dump(dump_root)
    frames = dump.dump.stack(dump["Torch.matmul.0.forward"]["stack"])
    assert (frames[0]["file"], frames[0]["line"], frames[0]["function"]) == (fake, 2, "attention")
    assert frames[1]["file"] == HERE


def test_every_steps_stack_ids_resolve_in_its_own_directory(dump_root):
    x = torch.randn(3)
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1")
    for step in range(3):
        dbg.start()
        x.exp()
        if step != 1:
            x.sin()   # a call site step 1 does not have
        dbg.stop()
        dbg.step()
    for directory in find_dumps(dump_root):
        dump = open_dump(directory)
        for record in dump.records():
            frames = dump.stack(record["stack"])
            assert frames and frames[0]["file"] == HERE, (directory, record["name"])


def test_records_carry_no_private_keys(tmp_path):
    """What capture keeps about a running call (its counter, an in-place op's finite inputs,
    the overflow sentence) never reaches the dump or `dbg.overflows`."""
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.randn(2, 3)
    for level, task in (("mix", "statistics"), ("L2", "tensor"), ("mix", "overflow_check")):
        dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / level / task), level=level, task=task,
                                       overflow_nums=-1)
        dbg.start(model)
        try:
            y = model(x) * 2 + 1                 # >= 1: mul_ below overflows
            y.mul_(1e39)                 # an in-place origin for overflow_check (float32 overflows)
            y.sum().backward()
        finally:
            dbg.stop()
        overflows = dbg.overflows
        dbg.step()
        for directory in find_dumps(tmp_path / level / task):
            for record in open_dump(directory).records():
                assert not [k for k in record if k.startswith("_")], record["name"]
        assert all(not k.startswith("_") for o in overflows for k in o)
        if task == "overflow_check":
            assert [o["name"] for o in overflows] == ["Tensor.mul_.0.forward"]
            assert overflows[0]["note"].startswith("in-place op")
