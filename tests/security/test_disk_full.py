"""A full disk never reaches the user's training: capture stops, warns once, and leaves a dump
that says where it ends (issue 31).

Two ways to fill the disk: a real 2 MiB tmpfs (skipped where mounting is refused), and
`os.write` -- the one OS call every byte of a dump goes through -- raising ENOSPC for the dump's
files once a byte budget is spent.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess

import pytest
import torch

import opdiff
from opdiff import schemas
from opdiff.cli import main
from opdiff.store.reader import open_dump


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))


def _train(dump_path=None, steps=3, task="tensor"):
    """A few SGD steps, recorded by opdiff when `dump_path` is given: the final parameters."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_path), task=task, level="mix") \
        if dump_path is not None else None
    for _ in range(steps):
        x = torch.randn(32, 128, generator=gen)
        if dbg is not None:
            dbg.start(model)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dbg is not None:
            dbg.stop()
            dbg.step()
    return [p.detach().clone() for p in model.parameters()]


def _bitwise_equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "opdiff" and r.levelno >= logging.WARNING]


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _whole_lines(path):
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), f"{path} ends in a cut line"
    return [json.loads(line) for line in raw.splitlines()]


@pytest.fixture
def full_disk(monkeypatch, tmp_path):
    """fill(capacity): from now on the files under tmp_path/"dump" live on a disk of `capacity`
    bytes: os.write writes what fits and then fails with ENOSPC; a file removed or cut back
    frees its bytes, as on a real disk. fill(None): no limit."""
    root = tmp_path / "dump"
    real = os.write
    state = {"capacity": None}

    def write(fd, data):
        capacity = state["capacity"]
        if capacity is None:
            return real(fd, data)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return real(fd, data)
        if not target.startswith(str(root)):
            return real(fd, data)
        used = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        view = memoryview(data).cast("B")
        if used >= capacity:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, view[:capacity - used])

    def fill(capacity):
        state["capacity"] = capacity

    monkeypatch.setattr(os, "write", write)
    return fill


def _used(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _compare(target, golden, out):
    result = opdiff.compare(target, golden, output_path=out, replay="off")
    summary = json.loads((out / "summary.json").read_text())
    schemas.validate("compare-summary", summary)      # cut sides are part of the contract
    return result, summary


def test_a_write_that_fills_the_disk_mid_step_cuts_that_step_only(tmp_path, full_disk, caplog):
    caplog.set_level(logging.WARNING, logger="opdiff")
    golden = tmp_path / "golden"
    _train(golden)
    expected = _train(None)
    full_disk(_used(golden / "step0") + 200_000)    # step 1 fills the disk part-way through
    params = _train(tmp_path / "dump")

    assert _bitwise_equal(params, expected), "opdiff changed the training"
    assert len(_warnings(caplog)) == 1, [w.getMessage() for w in _warnings(caplog)]
    assert "disk is full" in _warnings(caplog)[0].getMessage()
    dump = tmp_path / "dump"
    files = _files(dump)
    assert not [f for f in files if f.endswith(".tmp")], files
    assert not (dump / "step0" / "rank0" / "unfinished.json").exists()
    assert not (dump / "step2").exists(), "nothing is recorded after the disk filled"
    cut_dir = dump / "step1" / "rank0"
    records = _whole_lines(cut_dir / "records.jsonl")
    assert records, "the records flushed before the failure are kept"
    mark = json.loads((cut_dir / "unfinished.json").read_text())
    assert mark["state"] == "disk full" and mark["records"] == len(records)
    assert mark["last_record"] == records[-1]["name"]
    assert open_dump(cut_dir).cut() == {"why": "disk full", "records": len(records),
                                        "last_record": records[-1]["name"]}

    result, summary = _compare(cut_dir, golden / "step1" / "rank0", tmp_path / "out")
    assert result.verdict.startswith("inconclusive: step 1 rank 0: the target's disk filled at "
                                     f"record {len(records)}")
    assert summary["incomplete"] == [{"step": 1, "rank": 0, "side": "target", "why": "disk full",
                                      "records": len(records), "last_record": records[-1]["name"],
                                      "compared": True}]
    assert any(f"disk filled at record {len(records)}" in n for n in summary["notes"])
    # Its records name tensors of the shard the disk could not hold: read as statistics.
    assert result.first_divergence is None and result.counts["error"] == 0
    assert {r.mode for r in result.rows if r.result != "unmatched"} == {"statistics"}
    assert f"disk filled at record {len(records)}" in (tmp_path / "out" / "report.html").read_text()
    # The whole step before it compares as before: nothing is said about it.
    result, summary = _compare(dump / "step0" / "rank0", golden / "step0" / "rank0", tmp_path / "o0")
    assert summary["incomplete"] == [] and result.first_divergence is None


def test_a_run_whose_disk_fills_mid_step_ends_bitwise_equal_to_one_without_opdiff(
        tmp_path, full_disk, caplog):
    caplog.set_level(logging.WARNING, logger="opdiff")
    expected = _train(None, steps=4)
    for capacity in (0, 4100, 6_000, 150_000, 400_000, 900_000):   # mark, meta, records, tensors
        caplog.clear()
        full_disk(capacity)
        params = _train(tmp_path / "dump", steps=4)
        assert _bitwise_equal(params, expected), capacity
        assert len(_warnings(caplog)) == 1, capacity        # the disk did fill, once
        full_disk(None)
        assert not [f for f in _files(tmp_path / "dump") if f.endswith(".tmp")], capacity
        shutil.rmtree(tmp_path / "dump")


def test_a_full_disk_when_a_step_opens_leaves_nothing_and_raises_nothing(tmp_path, full_disk, caplog):
    caplog.set_level(logging.WARNING, logger="opdiff")
    full_disk(0)
    expected = _train(None)
    assert _bitwise_equal(_train(tmp_path / "dump"), expected)
    assert len(_warnings(caplog)) == 1
    assert "records nothing more" in _warnings(caplog)[0].getMessage()
    assert _files(tmp_path / "dump") == []


def test_a_records_line_cut_by_the_full_disk_is_cut_back(tmp_path, full_disk, monkeypatch):
    """A statistics step whose records.jsonl write stops half-way: the half line goes, the
    lines before it stay, and the reader says where the dump ends."""
    dump = tmp_path / "dump"
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump), task="statistics", level="L1")
    dbg.start()
    x = torch.ones(8)
    for _ in range(300):        # 256 records are flushed as the step goes
        x = x * 1.001
    records_file = dump / "step0" / "rank0" / "records.jsonl"
    assert records_file.stat().st_size > 0
    full_disk(_used(dump) + 700)    # the next flush writes part of a line, then fails
    for _ in range(300):
        x = x * 1.001
    dbg.stop()
    dbg.step()
    records = _whole_lines(records_file)
    assert 256 <= len(records) < 600
    assert open_dump(records_file.parent).cut()["why"] == "disk full"


def test_check_says_the_tensors_are_missing_not_that_it_is_a_statistics_dump(tmp_path, full_disk,
                                                                             capsys):
    golden = tmp_path / "golden"
    _train(golden, steps=1)
    full_disk(_used(golden) // 2)       # the step's only shard does not fit: removed
    _train(tmp_path / "dump", steps=1)
    cut_dir = tmp_path / "dump" / "step0" / "rank0"
    assert not list(cut_dir.rglob("*.safetensors"))
    assert open_dump(cut_dir).cut()["records"] > 0
    capsys.readouterr()
    assert main(["check", str(cut_dir)]) == 2
    err = capsys.readouterr().err
    assert "tensors are missing" in err and "statistics dump" not in err
    assert "disk full at record" in err


@pytest.fixture
def tmpfs(tmp_path):
    """A real 2 MiB file system (root only; skipped where mounting is refused)."""
    where = tmp_path / "fs"
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc})")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode(errors='replace').strip()})")
    yield where
    subprocess.run(["umount", str(where)], capture_output=True, timeout=30)


def test_a_real_full_file_system(tmp_path, tmpfs, caplog):
    caplog.set_level(logging.WARNING, logger="opdiff")
    expected = _train(None, steps=6)
    params = _train(tmpfs / "dump", steps=6)        # about 0.9 MB a step: full in step 2
    assert _bitwise_equal(params, expected)
    assert len(_warnings(caplog)) == 1
    files = _files(tmpfs)
    assert not [f for f in files if f.endswith(".tmp")], files
    cut = [d for d in sorted((tmpfs / "dump").glob("step*/rank0")) if (d / "unfinished.json").exists()]
    assert len(cut) == 1, files
    records = _whole_lines(cut[0] / "records.jsonl")
    assert open_dump(cut[0]).cut()["why"] == "disk full"
    assert json.loads((cut[0] / "unfinished.json").read_text())["records"] == len(records)
    # After the cut the file system has room again (the partial shard is gone).
    stat = os.statvfs(tmpfs)
    assert stat.f_bavail * stat.f_frsize > 100_000
