"""discover() opens msprobe dumps (statistics and tensor mode) as opdiff records.

The fixtures under tests/data/msprobe/ were written by real msprobe 26.2 (see tests/data/README.md);
every expectation here is read back from those files, not typed in.
"""
from __future__ import annotations

import json
import math
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from opdiff.errors import DumpError
from opdiff.store import decoded_stats, iter_tensors
from opdiff.store.adapters import discover
from opdiff.store.dumpfiles import UnreadableTensor

DATA = Path(__file__).resolve().parents[1] / "data" / "msprobe"
STATS = DATA / "statistics" / "golden"
TENSOR = DATA / "tensor" / "target"


def _raw(root: Path) -> dict:
    return json.loads((root / "step0" / "rank0" / "dump.json").read_text())["data"]


def _records(root: Path) -> dict:
    (dump,) = discover(root)
    return {r["name"]: r for r in dump.records()}


def _assert_stats(desc: dict, raw: dict):
    stats = decoded_stats(desc)
    for ours, theirs in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
        if raw[theirs] is None:
            assert stats[ours] is None
        else:
            assert stats[ours] == pytest.approx(raw[theirs], rel=0, abs=0)


@pytest.mark.parametrize("root,task", [(STATS, "statistics"), (TENSOR, "tensor")])
def test_msprobe_dump_opens_with_records_in_execution_order(root, task):
    (dump,) = discover(root)
    assert dump.format == "msprobe"
    assert (dump.step, dump.rank) == (0, 0)
    assert dump.meta["config"]["task"] == task
    assert bool(dump.tensor_keys()) is (task == "tensor")
    # Its tensors load by key, but replay is not offered on them (see adapters/msprobe.py).
    assert dump.holds_tensors is False
    assert dump.record_count() == len(_raw(root))
    raw = _raw(root)
    records = list(dump.records())
    assert [r["name"] for r in records] == list(raw)          # dump.json order, fwd and bwd mixed
    assert [r["seq"] for r in records] == list(range(len(raw)))
    first_backward = next(i for i, r in enumerate(records) if r["phase"] == "backward")
    assert records[first_backward]["name"] == "Functional.cross_entropy.0.backward"
    assert all(r["phase"] == "forward" for r in records[:first_backward])


def test_api_record_translates_arguments_statistics_and_parent_module():
    raw = _raw(STATS)["Functional.conv2d.0.forward"]
    rec = _records(STATS)["Functional.conv2d.0.forward"]
    assert (rec["op"], rec["kind"], rec["phase"]) == ("Functional.conv2d", "api", "forward")
    assert rec["module"] == "Module.stem.Conv2d.forward.0"      # from construct.json
    x = rec["inputs"][0]
    assert x["type"] == "tensor" and x["dtype"] == "float32" and x["shape"] == [2, 3, 4, 4]
    assert x["requires_grad"] is False and "key" not in x        # statistics mode: no files
    _assert_stats(x, raw["input_args"][0])
    assert decoded_stats(x)["nan"] == 0 and decoded_stats(x)["inf"] == 0   # finite max/min
    # stride (1, 1) is a list of ints; groups is an int
    assert rec["inputs"][3] == {"type": "list", "items": [{"type": "int", "value": 1}] * 2}
    assert rec["inputs"][6] == {"type": "int", "value": 1}
    _assert_stats(rec["outputs"][0], raw["output"][0])
    relu = _records(STATS)["Functional.relu.0.forward"]
    assert relu["kwargs"] == {"inplace": {"type": "bool", "value": False}}


def test_backward_module_and_param_grad_records():
    recs = _records(STATS)
    raw = _raw(STATS)
    bwd = recs["Tensor.__iadd__.0.backward"]
    assert (bwd["op"], bwd["kind"], bwd["phase"]) == ("Tensor.__iadd__", "api", "backward")
    assert bwd["forward"] == "Tensor.__iadd__.0.forward"
    _assert_stats(bwd["inputs"][0], raw["Tensor.__iadd__.0.backward"]["input"][0])
    conv_bwd = recs["Functional.conv2d.0.backward"]
    assert conv_bwd["outputs"][0] == {"type": "none"}   # no grad w.r.t. the input image
    assert conv_bwd["outputs"][1]["shape"] == [4, 3, 3, 3]

    mod = recs["Module.block.bn1.BatchNorm2d.forward.0"]
    assert (mod["op"], mod["kind"]) == ("Module.block.bn1.BatchNorm2d", "module")
    assert mod["module"] == "Module.block.Block.forward.0"
    assert set(mod["parameters"]) == {"weight", "bias"}
    assert recs["Module.block.Block.backward.0"]["forward"] == "Module.block.Block.forward.0"

    grad = recs["Module.fc.Linear.parameters_grad.0"]
    assert (grad["kind"], grad["phase"], grad["op"]) == ("param_grad", "backward",
                                                         "Module.fc.Linear.parameters_grad")
    names = {n: d for n, _, d in iter_tensors(grad)}
    assert set(names) == {"Module.fc.Linear.parameters_grad.0.bias",
                          "Module.fc.Linear.parameters_grad.0.weight"}
    assert names["Module.fc.Linear.parameters_grad.0.weight"]["shape"] == [3, 4]
    _assert_stats(names["Module.fc.Linear.parameters_grad.0.bias"],
                  raw["Module.fc.Linear.parameters_grad.0"]["bias"][0])


def test_integer_tensor_statistics_keep_unknowns_as_none():
    target = _records(STATS)["Functional.cross_entropy.0.forward"]["inputs"][1]
    assert target["dtype"] == "int64"
    stats = decoded_stats(target)
    assert (stats["max"], stats["min"]) == (2, 0)
    assert stats["mean"] is None and stats["norm"] is None    # msprobe 26.2 writes null for ints
    assert stats["nan"] == 0 and stats["inf"] == 0


def test_stacks_point_at_user_code_innermost_first():
    (dump,) = discover(STATS)
    recs = {r["name"]: r for r in dump.records()}
    frames = dump.stack(recs["Functional.conv2d.1.forward"]["stack"])
    assert frames, "msprobe wrote a stack for this op"
    assert frames[0]["file"].endswith("make_msprobe_fixtures.py")
    assert frames[0]["code"] == "out = self.conv1(x)"
    assert frames[0]["function"] == "forward" and frames[0]["line"] > 0
    assert not any("/torch/" in f["file"] for f in frames)
    # Backward calls have no stack in msprobe: they borrow their forward call's.
    bwd = recs["Functional.conv2d.1.backward"]
    assert bwd["stack"] == recs["Functional.conv2d.1.forward"]["stack"]
    assert dump.stack(None) == []


def test_tensor_mode_keys_load_the_saved_tensors():
    (dump,) = discover(TENSOR)
    files = {p.stem for p in (TENSOR / "step0/rank0/dump_tensor_data").glob("*.pt")}
    assert set(dump.tensor_keys()) == files
    seen = 0
    for record in dump.records():
        for name, _, desc in iter_tensors(record):
            assert desc["key"] == name           # msprobe's file names are opdiff's tensor names
            t = dump.tensor(desc["key"])
            assert list(t.shape) == desc["shape"] and str(t.dtype) == f"torch.{desc['dtype']}"
            stats = decoded_stats(desc)
            assert float(t.max()) == pytest.approx(stats["max"], rel=1e-6, abs=1e-7)
            assert float(t.min()) == pytest.approx(stats["min"], rel=1e-6, abs=1e-7)
            if t.is_floating_point() and t.numel() > 0:
                assert float(t.double().norm()) == pytest.approx(stats["norm"], rel=1e-5)
            seen += 1
    assert seen == len(files)
    assert dump.tensor("no.such.tensor") is None


def test_bare_nan_and_infinity_in_dump_json_are_read(tmp_path):
    dst = tmp_path / "step0" / "rank0"
    shutil.copytree(STATS / "step0" / "rank0", dst)
    doc = json.loads((dst / "dump.json").read_text())
    out = doc["data"]["Functional.relu.1.forward"]["output"][0]
    out["Max"], out["Min"] = math.nan, -math.inf
    text = json.dumps(doc, indent=1)             # Python's json writes bare NaN, as msprobe does
    assert '"Max": NaN' in text and '"Min": -Infinity' in text
    (dst / "dump.json").write_text(text)
    desc = _records(tmp_path)["Functional.relu.1.forward"]["outputs"][0]
    assert desc["stats"]["max"] == "NaN" and desc["stats"]["min"] == "-Infinity"
    stats = decoded_stats(desc)
    assert math.isnan(stats["max"]) and stats["min"] == -math.inf
    assert stats["nan"] is None and stats["inf"] is None     # counts unknown, not zero
    json.dumps(desc, allow_nan=False)                        # the record itself is strict JSON


def test_proc_directory_and_file_paths(tmp_path):
    shutil.copytree(STATS / "step0" / "rank0", tmp_path / "step0" / "proc4242")
    (dump,) = discover(tmp_path)
    assert (dump.step, dump.rank) == (0, None)
    (by_file,) = discover(STATS / "step0" / "rank0" / "dump.json")
    assert by_file.path == STATS / "step0" / "rank0"
    both = discover(DATA / "statistics")                    # golden/ and target/ below
    assert [d.format for d in both] == ["msprobe", "msprobe"]


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


def test_bad_input_raises_one_line_dump_errors(tmp_path):
    with pytest.raises(DumpError) as e:
        discover(tmp_path)
    assert "no dump found" in _one_line(e) and "dump.json" in str(e.value)
    with pytest.raises(DumpError) as e:
        discover(tmp_path / "missing")
    assert "no such file" in _one_line(e)

    rank = tmp_path / "trunc" / "step0" / "rank0"
    rank.mkdir(parents=True)
    full = (STATS / "step0" / "rank0" / "dump.json").read_bytes()
    (rank / "dump.json").write_bytes(full[: len(full) // 2])
    with pytest.raises(DumpError) as e:
        discover(tmp_path / "trunc")
    assert "truncated" in _one_line(e)

    # Broken in the middle but well-formed at both ends: found when the records are read.
    (rank / "dump.json").write_bytes(full.replace(b'"output"', b'"output" "', 1))
    (dump,) = discover(tmp_path / "trunc")
    with pytest.raises(DumpError) as e:
        list(dump.records())
    assert "not valid JSON" in _one_line(e)

    (rank / "dump.json").write_bytes(b"")
    with pytest.raises(DumpError) as e:
        discover(tmp_path / "trunc")
    assert "empty" in _one_line(e)

    (rank / "dump.json").write_bytes(b'["not", "an", "object"]')
    with pytest.raises(DumpError) as e:
        discover(tmp_path / "trunc")
    assert "JSON object" in _one_line(e)

    evil = tmp_path / "evil" / "dump.pkl"
    evil.parent.mkdir()
    evil.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(DumpError) as e:
        discover(evil.parent)
    assert "never loads" in _one_line(e)
    with pytest.raises(DumpError) as e:
        discover(tmp_path / "evil" / "dump.pkl")
    assert "pickle" in _one_line(e)

    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(DumpError) as e:
        discover(other)
    assert "not a dump file" in _one_line(e)


def test_unrelated_pickles_next_to_a_dump_are_ignored(tmp_path):
    shutil.copytree(STATS / "step0", tmp_path / "step0")
    (tmp_path / "optimizer_state.pkl").write_bytes(pickle.dumps([1, 2, 3]))
    (dump,) = discover(tmp_path)
    assert dump.format == "msprobe"


def test_unreadable_tensor_file_is_that_tensors_problem(tmp_path):
    shutil.copytree(TENSOR / "step0", tmp_path / "step0")
    victim = tmp_path / "step0/rank0/dump_tensor_data/Tensor.__iadd__.0.forward.output.0.pt"
    victim.write_bytes(b"garbage")
    (dump,) = discover(tmp_path)
    # Not a DumpError: the compare goes on with that tensor's statistics (pair.py).
    with pytest.raises(UnreadableTensor) as e:
        dump.tensor("Tensor.__iadd__.0.forward.output.0")
    assert not isinstance(e.value, DumpError) and isinstance(e.value, ValueError)
    assert "cannot load tensor" in _one_line(e)
    assert isinstance(dump.tensor("Tensor.__iadd__.0.forward.input.0"), torch.Tensor)


def test_older_stack_json_layout_one_stack_per_op(tmp_path):
    # msprobe before the grouped layout wrote {op name: [frame strings]} (its own loader still
    # reads both); some versions join the frames into one string.
    dst = tmp_path / "step0" / "rank0"
    shutil.copytree(STATS / "step0" / "rank0", dst)
    grouped = json.loads((dst / "stack.json").read_text())
    by_name = {name: frames for names, frames in grouped.values() for name in names}
    by_name["Functional.conv2d.1.forward"] = "".join(f + " \n" for f in by_name["Functional.conv2d.1.forward"])
    (dst / "stack.json").write_text(json.dumps(by_name))
    (new,) = discover(tmp_path)
    (old,) = discover(STATS)
    new_recs = {r["name"]: r for r in new.records()}
    for record in old.records():
        assert new.stack(new_recs[record["name"]]["stack"]) == old.stack(record["stack"]), record["name"]
    assert new.stack(new_recs["Functional.conv2d.1.forward"]["stack"])[0]["code"] == "out = self.conv1(x)"
