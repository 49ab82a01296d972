"""A run killed mid-step, and a tensor shard cut short, are said as such: in the verdict, the
notes, summary.json's `incomplete` and the HTML report -- never compared as if whole (issue 31).
The killed run is a real process, stopped with SIGKILL once some records are on disk."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import opdiff
from opdiff import schemas
from opdiff.store.reader import open_dump

TRAIN = textwrap.dedent("""
    import sys, time
    import torch
    import opdiff

    dump, mode = sys.argv[1], sys.argv[2]
    dbg = opdiff.PrecisionDebugger(dump_path=dump, task="statistics", level="L1")
    for step in range(2):
        dbg.start()
        x = torch.ones(16)
        for _ in range(400):            # 800 records: several flushes of 256 reach the disk
            x = x * 1.0001 + 0.5
        if step == 1 and mode == "kill":
            print("flushed", flush=True)
            time.sleep(600)
        dbg.stop()
        dbg.step()
    print("done", flush=True)
""")


def _run(script, dump, mode):
    return subprocess.Popen([sys.executable, str(script), str(dump), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """(a dump whose step 1 was killed mid-way, the same run's dump left to finish)."""
    root = tmp_path_factory.mktemp("killed")
    script = root / "train.py"
    script.write_text(TRAIN)
    golden = _run(script, root / "golden", "full")
    target = _run(script, root / "target", "kill")
    try:
        assert target.stdout.readline().strip() == "flushed", target.stderr.read()
        os.kill(target.pid, signal.SIGKILL)
        target.wait(timeout=60)
        assert golden.communicate(timeout=300)[0].strip() == "done"
    finally:
        for p in (golden, target):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert target.returncode == -signal.SIGKILL
    return root / "target", root / "golden"


def _lines(path):
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _compare(target, golden, out):
    result = opdiff.compare(target, golden, output_path=out, replay="off")
    summary = json.loads((out / "summary.json").read_text())
    schemas.validate("compare-summary", summary)      # cut sides are part of the contract
    return result, summary


def test_a_killed_step_is_named_with_its_last_record(killed, tmp_path):
    target, golden = killed
    cut_dir = target / "step1" / "rank0"
    records = _lines(cut_dir / "records.jsonl")
    assert 256 <= len(records) < 800, "the kill came after some flushes, before the step's end"
    assert not (target / "step0" / "rank0" / "unfinished.json").exists()
    assert open_dump(cut_dir).cut() == {"why": "killed", "records": len(records),
                                        "last_record": records[-1]["name"]}

    result, summary = _compare(cut_dir, golden / "step1" / "rank0", tmp_path / "one")
    where = f"step 1 rank 0: the target dump was cut at record {len(records)}"
    assert result.verdict.startswith("inconclusive: " + where), result.verdict
    assert "no divergence" not in result.verdict.split(";")[0]
    assert summary["incomplete"] == [{"step": 1, "rank": 0, "side": "target", "why": "killed",
                                      "records": len(records), "last_record": records[-1]["name"],
                                      "compared": True}]
    assert any(n.startswith(where) for n in summary["notes"])
    assert where in (tmp_path / "one" / "report.html").read_text()


def test_the_whole_roots_compare_names_only_the_killed_pair(killed, tmp_path):
    target, golden = killed
    result, summary = _compare(target, golden, tmp_path / "roots")
    assert [(i["step"], i["rank"], i["why"]) for i in summary["incomplete"]] == [(1, 0, "killed")]
    pairs = {p["step"]: p for p in summary["pairs"]}
    assert pairs[0]["cut"] is None and pairs[0]["incomplete"] is None
    assert pairs[1]["cut"][0]["why"] == "killed" and pairs[1]["incomplete"] is None
    assert result.verdict.startswith("inconclusive: step 1 rank 0")


def test_a_cut_last_line_is_a_cut_even_without_the_mark(killed, tmp_path):
    """An older opdiff's dump (no unfinished.json) whose last line was cut by the kill."""
    target, _ = killed
    cut_dir = tmp_path / "step1" / "rank0"
    shutil.copytree(target / "step1" / "rank0", cut_dir)
    (cut_dir / "unfinished.json").unlink()
    records = _lines(cut_dir / "records.jsonl")
    with open(cut_dir / "records.jsonl", "ab") as f:
        f.write(b'{"name": "Tensor.mul.9')
    assert open_dump(cut_dir).cut() == {"why": "killed", "records": len(records),
                                        "last_record": records[-1]["name"]}


def test_a_step_stopped_but_never_ended_is_whole(tmp_path):
    """start()/stop() without step(): everything is on disk at stop(); not a cut."""
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    dbg.start()
    torch.ones(4).mul(2).add(1)
    dbg.stop()
    step = tmp_path / "d" / "step0" / "rank0"
    assert json.loads((step / "unfinished.json").read_text())["state"] == "stopped"
    assert open_dump(step).cut() is None
    dbg.start()                 # resumed: more records than at stop()
    torch.ones(4).exp()
    dbg.session.flush()
    assert open_dump(step).cut()["why"] == "killed"
    dbg.stop()
    dbg.step()
    assert not (step / "unfinished.json").exists() and open_dump(step).cut() is None


def test_a_truncated_shard_reaches_the_summary_and_the_report(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    for side in ("golden", "target"):
        model.zero_grad()
        with opdiff.dump(model, str(tmp_path / side), level="mix", task="tensor"):
            model(x).sum().backward()
    shard = sorted((tmp_path / "target").rglob("*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    result, summary = _compare(tmp_path / "target", tmp_path / "golden", tmp_path / "out")
    said = f"the target's tensor shard {shard.name} is unreadable"
    assert any(said in n for n in summary["notes"]), summary["notes"]
    assert said in (tmp_path / "out" / "report.html").read_text()
    assert summary["incomplete"] == []          # the records are whole: compared, by statistics
    assert result.first_divergence is None
