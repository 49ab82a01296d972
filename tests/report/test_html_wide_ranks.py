"""A run of many ranks and steps: the step/rank grid and the pairs table scroll inside the
verdict box instead of running off a 1400 px page."""
from __future__ import annotations

from dataclasses import replace

from opdiff.comparison.runs import merge
from opdiff.report.html import write_html


def _wide(build_cnn_result, ranks=4, steps=40):
    clean = replace(build_cnn_result(), first_divergence=None)
    results = [replace(clean, step=s, rank=r, target=f"/d/npu/step{s}/rank{r}",
                       golden=f"/d/gpu/step{s}/rank{r}") for s in range(steps) for r in range(ranks)]
    return merge("/d/npu", "/d/gpu", results, [])


def test_many_steps_scroll_inside_the_box(browser, cnn_result, tmp_path):
    page = browser.open(write_html(_wide(cnn_result), tmp_path / "report.html"))
    try:
        assert page.errors() == []
        page.eval("document.body.style.width = '1400px'")
        assert page.eval("document.documentElement.scrollWidth") <= 1400
        assert page.eval("document.querySelector('table.rankgrid').parentElement.className") \
            == "scroll-x"
        assert page.eval("document.querySelector('table.pairs').parentElement.className") \
            == "scroll-x"
    finally:
        page.close()
