"""A step cut before its first record (the run was killed as the step began) is not a step that
agrees: the compare of the other steps says "inconclusive", never "no divergence" (SECURITY.md:
it never calls a cut run whole). The killed run is a real process, stopped with SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from opdiff.cli import main

TRAIN = textwrap.dedent("""
    import sys, time
    import torch
    import opdiff

    dump, mode = sys.argv[1], sys.argv[2]
    dbg = opdiff.PrecisionDebugger(dump_path=dump, task="statistics", level="L1")
    for step in range(2):
        dbg.start()
        if step == 1 and mode == "kill":
            print("started", flush=True)
            time.sleep(600)
        x = torch.ones(16)
        for _ in range(20):
            x = x * 1.0001 + 0.5
        dbg.stop()
        dbg.step()
    print("done", flush=True)
""")


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    root = tmp_path_factory.mktemp("cut_early")
    script = root / "train.py"
    script.write_text(TRAIN)
    procs = {mode: subprocess.Popen([sys.executable, str(script), str(root / mode), mode],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=dict(os.environ)) for mode in ("full", "kill")}
    try:
        assert procs["kill"].stdout.readline().strip() == "started", procs["kill"].stderr.read()
        os.kill(procs["kill"].pid, signal.SIGKILL)
        procs["kill"].wait(timeout=60)
        assert procs["full"].communicate(timeout=300)[0].strip() == "done"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert (root / "kill" / "step1" / "rank0" / "unfinished.json").exists()
    return root / "kill", root / "full"


def test_a_step_cut_before_its_first_record_is_inconclusive(killed, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["compare", str(killed[0]), str(killed[1]), "-o", str(out), "--no-progress"])
    said = capsys.readouterr().out
    assert code == 0, said
    verdict = next(line for line in said.splitlines()
                   if not line.startswith(("note:", "  ", "Wrote", "opdiff")))
    assert verdict.startswith("inconclusive: step 1 rank 0: the target holds no op records"), said
    assert "no divergence" not in said and "agrees" not in verdict
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"] is None and "inconclusive" in summary["note_kinds"]
    assert [(i["step"], i["side"]) for i in summary["incomplete"]] == [(1, "target")]
