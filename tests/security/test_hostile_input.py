"""A dump is untrusted input: every malformed or hostile file in it ends the command with exit 2
and one line on stderr (never a traceback, never a hang, never unbounded memory), through the
real `opdiff compare` / `check` / `overflow`: `opdiff.cli.main` in this process, and in a
process of its own (with a timeout) where a file could make it hang or eat memory."""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from sec_input_dumps import capture, cli

from opdiff.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "msprobe" / "tensor"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    return capture(root / "t", fault=True), capture(root / "g", fault=False)


@pytest.fixture
def target(dumps, tmp_path):
    """A fresh copy of the faulty dump (step0/rank0) to spoil."""
    return Path(shutil.copytree(dumps[0], tmp_path / "t" / "step0" / "rank0"))


class _Run:
    """What `opdiff ARGS` did: returncode, stdout, stderr (as subprocess.CompletedProcess)."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(capsys):
    def go(*args: str) -> _Run:
        capsys.readouterr()
        rc = main(list(args))
        out = capsys.readouterr()
        return _Run(rc, out.out, out.err)
    return go


def _bad_input(proc, *words):
    """Exit 2, one line on stderr naming the problem, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.fixture
def compare(run, dumps):
    return lambda target, *more: run("compare", str(target), str(dumps[1]), *more)


# -- records.jsonl ---------------------------------------------------------------------------------
def test_non_utf8_bytes_in_a_record(target, compare, run):
    lines = _lines(target / "records.jsonl")
    lines[1] = lines[1].replace(b'"Functional', b'"\xff\xfeFunctional', 1)
    (target / "records.jsonl").write_bytes(b"".join(lines))
    _bad_input(compare(target), "records.jsonl", "line 2", "corrupt")
    _bad_input(run("overflow", str(target)), "line 2")


def test_a_character_cut_by_a_kill_at_the_end_is_a_truncated_line(target, compare, caplog):
    with open(target / "records.jsonl", "ab") as f:
        f.write(b'{"name": "Functional.relu.9.forward", "op": "caf\xc3')     # cut inside "e"
    with open(target / "stacks.jsonl", "ab") as f:
        f.write(b'{"id": 7, "frames": [{"file": "x.py", "line": 1, "code": "\xe2\x82')
    proc = compare(target)
    assert proc.returncode == 0, proc.stderr
    assert "Functional.linear.1.forward" in proc.stdout      # the finding is still made
    warned = [r.getMessage() for r in caplog.records if "truncated line" in r.getMessage()]
    assert any("records.jsonl" in w for w in warned) and any("stacks.jsonl" in w for w in warned)


def test_a_record_that_is_a_list(target, compare, run):
    lines = _lines(target / "records.jsonl")
    lines.insert(1, b'["Functional.linear.0.forward", 1, 2]\n')
    (target / "records.jsonl").write_bytes(b"".join(lines))
    _bad_input(compare(target), "line 2", "not an opdiff record")
    _bad_input(run("check", str(target)), "line 2")


@pytest.mark.parametrize("field,value", [("inputs", "abc"), ("stack", [1]), ("name", 3),
                                         ("kwargs", [1]), ("outputs", [{"type": 5}]),
                                         ("inputs", [{"type": "tensor", "shape": "big"}]),
                                         ("inputs", [{"type": "tensor", "producer": {"a": 1}}]),
                                         ("inputs", [{"type": "tensor", "producer": [[0], 0]}])])
def test_record_fields_of_the_wrong_type(target, compare, field, value):
    lines = _lines(target / "records.jsonl")
    record = json.loads(lines[0])
    record[field] = value
    lines[0] = json.dumps(record).encode() + b"\n"
    (target / "records.jsonl").write_bytes(b"".join(lines))
    _bad_input(compare(target), "line 1", "not an opdiff record")


def test_deep_nesting(target, compare, run):
    lines = _lines(target / "records.jsonl")
    lines.insert(2, b"[" * 100_000 + b"]" * 100_000 + b"\n")
    (target / "records.jsonl").write_bytes(b"".join(lines))
    _bad_input(compare(target), "line 3", "nested")
    _bad_input(run("overflow", str(target)), "nested")
    # Deep, but under Python's own recursion limit: still refused, before anything walks it.
    lines[2] = b'{"name": "a", "op": "a", "kind": "api", "phase": "forward", "x": ' \
        + b"[" * 500 + b"]" * 500 + b"}\n"
    (target / "records.jsonl").write_bytes(b"".join(lines))
    _bad_input(compare(target), "line 3", "nested")


def test_a_line_longer_than_the_limit(target, compare):
    from opdiff.store.dumpfiles import MAX_LINE_BYTES

    with open(target / "records.jsonl", "r+b") as f:
        first = f.readline()
        rest = f.read()
        f.seek(0)
        f.write(first[:-2] + b', "pad": "' + b"x" * (MAX_LINE_BYTES + 1) + b'"}\n' + rest)
    _bad_input(compare(target), "line 1", "longer than")


def test_records_as_a_symlink_to_dev_zero(target, dumps):
    """In a process of its own: today's reader grows until MemoryError."""
    os.remove(target / "records.jsonl")
    os.symlink("/dev/zero", target / "records.jsonl")
    _bad_input(cli("compare", str(target), str(dumps[1]), timeout=60), "outside the dump")
    _bad_input(cli("check", str(target), timeout=60), "outside the dump")


def test_records_as_a_symlink_leaving_the_dump(target, compare, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    shutil.move(target / "records.jsonl", outside)
    os.symlink(outside, target / "records.jsonl")
    _bad_input(compare(target), "outside the dump")
    # A link that stays inside the dump is an ordinary file of it.
    inside = target / "kept.jsonl"
    shutil.move(outside, inside)
    os.remove(target / "records.jsonl")
    os.symlink("kept.jsonl", target / "records.jsonl")
    assert compare(target).returncode == 0


def test_a_fifo_never_hangs(target, dumps):
    """In processes of their own: today's reader waits forever for a writer."""
    for name in ("records.jsonl", "meta.json"):
        os.replace(target / name, target / f"{name}.kept")
        os.mkfifo(target / name)
        _bad_input(cli("compare", str(target), str(dumps[1]), timeout=60), "FIFO", name)
        _bad_input(cli("overflow", str(target), timeout=60), "FIFO", name)
        os.remove(target / name)
        os.replace(target / f"{name}.kept", target / name)
    # The call stacks are read when a finding needs its line.
    os.remove(target / "stacks.jsonl")
    os.mkfifo(target / "stacks.jsonl")
    _bad_input(cli("compare", str(target), str(dumps[1]), timeout=60), "FIFO", "stacks.jsonl")


def test_a_shard_that_is_a_fifo_is_skipped(target, compare, caplog):
    shard = next((target / "tensors").glob("*.safetensors"))
    os.remove(shard)
    os.mkfifo(shard)
    proc = compare(target, "--replay", "off")      # the statistics are compared instead
    assert proc.returncode == 0, proc.stderr
    assert any("FIFO" in r.getMessage() for r in caplog.records)


# -- meta.json -------------------------------------------------------------------------------------
@pytest.mark.parametrize("meta,words", [({"format_version": "1"}, ("format_version", "'1'")),
                                        ([1, 2], ("list", "meta.json")),
                                        ({"format_version": True}, ("format_version",))])
def test_meta_of_the_wrong_shape(target, compare, run, meta, words):
    (target / "meta.json").write_text(json.dumps(meta))
    _bad_input(compare(target), *words)
    _bad_input(run("check", str(target)), *words)
    _bad_input(run("overflow", str(target)), *words)


def test_meta_nested_deep_or_too_large(target, compare):
    from opdiff.store.dumpfiles import MAX_LINE_BYTES

    (target / "meta.json").write_text('{"config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _bad_input(compare(target), "meta.json", "nested")
    (target / "meta.json").write_text('{"config": "' + "x" * (MAX_LINE_BYTES + 1) + '"}')
    _bad_input(compare(target), "meta.json", "larger than")


# -- stacks.jsonl ----------------------------------------------------------------------------------
def _stack_lines(target: Path) -> list[bytes]:
    """stacks.jsonl's lines, with one more after them (so that the first is not the last)."""
    lines = _lines(target / "stacks.jsonl")
    return lines + [b'{"id": 99, "frames": []}\n']


def test_a_stack_without_frames(target, compare):
    lines = _stack_lines(target)
    lines[0] = b'{"id": 0}\n'
    (target / "stacks.jsonl").write_bytes(b"".join(lines))
    _bad_input(compare(target), "stacks.jsonl", "line 1", "call stack")


def test_non_utf8_bytes_in_a_stack(target, compare):
    lines = _stack_lines(target)
    lines[0] = lines[0].replace(b'"code":"', b'"code":"\xff', 1)
    (target / "stacks.jsonl").write_bytes(b"".join(lines))
    _bad_input(compare(target), "stacks.jsonl", "line 1")


# -- foreign dumps (msprobe) -----------------------------------------------------------------------
@pytest.fixture
def msprobe_target(tmp_path):
    return Path(shutil.copytree(DATA / "target", tmp_path / "mt"))


def test_msprobe_dump_json_fifo_and_symlink(msprobe_target, tmp_path):
    rank = msprobe_target / "step0" / "rank0"
    os.remove(rank / "dump.json")
    os.mkfifo(rank / "dump.json")
    _bad_input(cli("compare", str(msprobe_target), str(DATA / "golden"), timeout=60), "FIFO")
    os.remove(rank / "dump.json")
    os.symlink("/dev/zero", rank / "dump.json")
    _bad_input(cli("overflow", str(msprobe_target), timeout=60), "outside the dump")


def test_msprobe_dump_json_nested_deep(msprobe_target, run):
    rank = msprobe_target / "step0" / "rank0"
    text = (rank / "dump.json").read_text()
    cut = text.index('"data"')
    (rank / "dump.json").write_text(text[:cut] + '"deep": ' + "[" * 100_000 + "]" * 100_000
                                    + ", " + text[cut:])
    _bad_input(run("compare", str(msprobe_target), str(DATA / "golden")), "nested")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-opdiff-test",))


def test_a_hostile_pickle_refuses_one_tensor_not_the_compare(msprobe_target, tmp_path, run):
    """`.pt` loads with weights_only=True: a pickle that would run code is that tensor's
    problem (a statistics row with a note), and the code never runs."""
    rank = msprobe_target / "step0" / "rank0" / "dump_tensor_data"
    name = "Tensor.__iadd__.0.forward.output.0"
    with open(rank / f"{name}.pt", "wb") as f:
        pickle.dump(_Payload(), f)
    out = tmp_path / "out"
    proc = run("compare", str(msprobe_target), str(DATA / "golden"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (Path.cwd() / "pwned-by-opdiff-test").exists()
    assert not (tmp_path / "pwned-by-opdiff-test").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"]["name"] == "Tensor.__iadd__.0.forward"
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    fields = rows[0]["fields"]
    row = dict(zip(fields, next(r for r in rows[1:] if r[fields.index("target_name")] == name)))
    assert row["mode"] == "statistics" and "saved tensor unreadable" in row["reason"] and "pickle" in row["reason"], row


def test_npy_never_unpickles(tmp_path):
    from opdiff.store.adapters.msprobe import load_tensor_file
    from opdiff.store.dumpfiles import UnreadableTensor

    import numpy as np

    path = tmp_path / "x.npy"
    np.save(path, np.array([_Payload()], dtype=object), allow_pickle=True)
    with pytest.raises(UnreadableTensor, match="cannot load"):
        load_tensor_file(path)
    assert torch.is_tensor(load_tensor_file(_saved(tmp_path / "ok.npy")))


def _saved(path: Path) -> Path:
    import numpy as np

    np.save(path, np.arange(3.0))
    return path


# -- foreign dumps (ptdbg_ascend .pkl) ---------------------------------------------------------------
PTDBG = Path(__file__).resolve().parents[1] / "data" / "msprobe" / "legacy" / "ptdbg_v4"


@pytest.mark.parametrize("bad,words", [(b"[" * 100_000 + b"]" * 100_000, ("line 2", "nested")),
                                       (b'["Functional_conv2d_0_forward_input.9", 1, [], "\xff"]',
                                        ("line 2", "not valid JSON"))],
                         ids=["nested", "not-utf8"])
def test_a_ptdbg_pkl_line_that_is_not_json(tmp_path, run, bad, words):
    dump = Path(shutil.copytree(PTDBG, tmp_path / "p"))
    pkl = next(dump.rglob("*.pkl"))
    lines = _lines(pkl)
    lines.insert(1, bad + b"\n")
    pkl.write_bytes(b"".join(lines))
    _bad_input(run("overflow", str(pkl)), *words)
    _bad_input(run("compare", str(pkl), str(pkl)), *words)
