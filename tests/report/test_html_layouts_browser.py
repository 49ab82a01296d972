"""report.html's "Rank layouts" table in headless Chromium: one row per side and step, shown
before the chart, every name escaped, no script error; a result without layouts has none. (The
facts of real merged runs: tests/distributed/test_layout_facts.py.)"""
from __future__ import annotations

from dataclasses import replace

from opdiff.comparison.layouts.facts import LayoutFacts, Replica
from opdiff.report.html import write_html

_TARGET = LayoutFacts("target", 0, ("mesh", "tp", "ddp"), 4, (0, 1, 2, 3), mesh=(2, 2),
                      counts={"shard": 52, "partial": 3, "replicate": 45}, left_out=7,
                      replicas=(Replica("<b>model.weight</b>", 3, 0),), culprit_ranks=(3,))
_GOLDEN = LayoutFacts("golden", 0, ("none",), 1, (0,), "one rank")


def test_rank_layouts_table_is_shown_and_escaped(browser, cnn_result, tmp_path):
    result = replace(cnn_result(), layouts=[_TARGET, _GOLDEN])
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        assert page.errors() == []
        rows = page.eval("[...document.querySelectorAll('#rank-layouts tbody tr')].map("
                         "tr => [...tr.children].map(c => c.textContent))")
        assert rows[0] == ["target", "0", "mesh, tp, ddp (2 x 2 mesh)",
                           "merged: ranks [0, 1, 2, 3] of 4", "3 partial, 45 replicate, 52 shard",
                           "7", "rank 3's <b>model.weight</b> (against rank 0's)", "rank 3"]
        assert rows[1] == ["golden", "0", "none", "one rank: ranks [0] of 1", "-", "0", "none",
                           "-"]
        assert page.eval("document.querySelector('#rank-layouts b')") is None   # text, not HTML
        assert page.eval("document.querySelector('#rank-layouts').getBoundingClientRect()"
                         ".height") > 0
        before = page.eval("!!(document.querySelector('#rank-layouts').compareDocumentPosition("
                           "document.querySelector('#chart-card')) & 4)")
        assert before
    finally:
        page.close()
    assert 'id="rank-layouts"' not in write_html(cnn_result(), tmp_path / "plain.html").read_text()
