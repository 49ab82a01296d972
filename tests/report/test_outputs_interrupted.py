"""Ctrl-C while `opdiff compare` writes its files never leaves a part that looks whole without
saying so (issue 46, item 12): the command says which files it wrote and which it did not. A
real compare process, interrupted by a real SIGINT once its CSV is in OUT."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

RUN = textwrap.dedent("""
    import sys, torch, opdiff
    torch.manual_seed(0)
    dbg = opdiff.PrecisionDebugger(dump_path=sys.argv[1], task="statistics", level="L1")
    dbg.start()
    x = torch.randn(64)
    for _ in range(1500):           # 6000 rows: the page takes a while to write
        x = torch.tanh(x * 1.01 + 0.1)
    dbg.stop()
    dbg.step()
""")


@pytest.mark.slow
def test_an_interrupted_write_says_what_is_missing(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    for side in ("a", "b"):
        subprocess.run([sys.executable, str(script), str(tmp_path / side)], check=True,
                       timeout=300, env=dict(os.environ))
    for attempt in range(3):    # the signal may land after the last file (a race, not the
        out = tmp_path / f"out{attempt}"                      # behaviour under test): again
        p = subprocess.Popen([sys.executable, "-m", "opdiff", "compare", str(tmp_path / "a"),
                              str(tmp_path / "b"), "-o", str(out), "--replay", "off"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ))
        try:
            deadline = time.monotonic() + 240
            while not (out.is_dir() and any(n.endswith(".csv") for n in os.listdir(out))):
                assert p.poll() is None and time.monotonic() < deadline, p.communicate()
                time.sleep(0.002)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        if p.returncode != 0:
            break
    assert p.returncode == 130, err
    said = next(line for line in err.splitlines() if "was interrupted" in line)
    found = re.search(r"was interrupted: (.+) (?:is|are) not written \((.+) (?:is|are) there\)",
                      said)
    assert found, said
    missing, there = found.group(1).split(", "), found.group(2).split(", ")
    assert "summary.json" in missing, said
    assert all(not (out / name).exists() for name in missing), (said, os.listdir(out))
    assert there and all((out / name).exists() for name in there), (said, os.listdir(out))
    assert err.strip().endswith("opdiff: interrupted")
