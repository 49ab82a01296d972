"""The compare's progress bar: it counts step/rank pairs when there are several (either engine
calls `pair_done`), and stays quiet when stderr is not a terminal unless asked for."""
from __future__ import annotations

import os
import subprocess
import sys

from opdiff.report.console import Progress


def test_the_bar_counts_pairs_when_there_are_several():
    bar = Progress(100, False, pairs=4)
    assert bar.description() == "comparing 0/4 step/rank pairs"
    for _ in range(3):
        bar.pair_done()
    assert bar.description() == "comparing 3/4 step/rank pairs"
    assert Progress(100, False, pairs=1).description() == "comparing ops"
    assert Progress(100, False).description() == "comparing ops"


def test_piped_compare_prints_no_bar(roots, tmp_path):
    # A real multi-pair compare through the CLI with stderr piped: no bar, however long it runs.
    code = ("import sys; from opdiff.report.console import Progress; Progress.DELAY_S = 0; "
            "from opdiff.cli import main; "
            f"sys.exit(main(['compare', {str(roots[0])!r}, {str(roots[1])!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step/rank pairs" not in done.stderr and "comparing ops" not in done.stderr
    assert "First divergence" in done.stdout or "Functional.gelu" in done.stdout


def test_a_forced_bar_shows_the_pairs(roots):
    code = ("import opdiff; "
            f"opdiff.compare({str(roots[0])!r}, {str(roots[1])!r}, progress=True)")
    env = {**os.environ, "COLUMNS": "120", "FORCE_COLOR": "1"}    # rich draws into the pipe
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step/rank pairs" in done.stderr
