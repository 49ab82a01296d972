"""An inconclusive compare never looks healthier on report.html than its verdict (issue 46,
item 3): the verdict box of a run that was killed mid-step says "Inconclusive", not a green "No
divergence", and the terminal prints that verdict in yellow, not green. The killed run is a real
process that leaves the step unfinished once some records are on disk."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest

import opdiff
from opdiff.report.console import INCONCLUSIVE, print_result, verdict_kind
from opdiff.terminal import SafeConsole

TRAIN = textwrap.dedent("""
    import os, sys
    import torch
    import opdiff

    dump, mode = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    dbg = opdiff.PrecisionDebugger(dump_path=dump, task="statistics", level="L1")
    dbg.start(model)
    x = torch.randn(8, 16)
    for _ in range(150):            # 600 records: more than one flush of 256 reaches the disk
        x = torch.nn.functional.pad(model(x), (0, 12))
    if mode == "die":
        os._exit(0)                 # gone without closing the step, as a killed run is
    dbg.stop()
    dbg.step()
""")


@pytest.fixture(scope="module")
def cut_compare(tmp_path_factory):
    root = tmp_path_factory.mktemp("cut")
    script = root / "train.py"
    script.write_text(TRAIN)
    for side, mode in (("target", "die"), ("golden", "full")):
        subprocess.run([sys.executable, str(script), str(root / side), mode], check=True,
                       timeout=300, env=dict(os.environ))
    out = root / "out"
    result = opdiff.compare(root / "target", root / "golden", output_path=out, replay="off")
    return result, out


def test_the_verdict_is_inconclusive_and_says_so(cut_compare):
    result, _ = cut_compare
    assert result.first_divergence is None
    assert result.verdict.startswith("inconclusive: ")
    assert verdict_kind(result) == INCONCLUSIVE


def test_the_terminal_prints_it_in_yellow(cut_compare):
    result, _ = cut_compare
    con = SafeConsole(file=io.StringIO(), force_terminal=True, color_system="standard", width=400)
    print_result(result, console=con)
    line = next(ln for ln in con.file.getvalue().splitlines() if "inconclusive: step" in ln
                and "note:" not in ln)
    assert "\x1b[33m" in line and "\x1b[32m" not in line, repr(line)


def test_the_report_page_says_inconclusive_not_no_divergence(browser, cut_compare):
    _, out = cut_compare
    page = browser.open(out / "report.html")
    try:
        assert page.errors() == []
        box = page.eval("(() => { const b = document.getElementById('verdict'); return "
                        "{cls: b.className, title: b.querySelector('.culprit').textContent, "
                        "text: b.textContent, border: getComputedStyle(b).borderLeftColor, "
                        "cell: [...b.querySelectorAll('td.gridcell')].map(c => c.className)}; })()")
        assert box["title"] == "Inconclusive", box
        assert "No divergence" not in box["text"]
        assert "clean" not in box["cls"].split()
        pass_green = page.eval("getComputedStyle(document.documentElement)"
                               ".getPropertyValue('--pass').trim()")
        assert box["border"] != page.eval(
            f"(() => {{ const d = document.createElement('div'); d.style.color = '{pass_green}';"
            " document.body.appendChild(d); const c = getComputedStyle(d).color; d.remove();"
            " return c; })()")
        assert "inconclusive: step 0 rank 0" in box["text"]     # the verdict's own words
        assert all("pass" not in c.split() for c in box["cell"]), box["cell"]
    finally:
        page.close()
