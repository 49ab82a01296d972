"""The multi-rank page in headless Chromium: the rank x step grid (worst verdict per cell, the
first divergence marked), the pairs table (paths and counts as text, no NaN, no raw JSON) and
step/rank columns in the rows table; summary.json's per-pair first divergence."""
from __future__ import annotations

from dataclasses import replace

from opdiff.comparison.runs import merge
from opdiff.report.html import write_html
from opdiff.report.summary import summary_dict


def _multi(build_cnn_result):
    clean = build_cnn_result()
    clean = replace(clean, first_divergence=None)
    results = []
    for step in (0, 1):
        for rank in (0, 1):
            base = build_cnn_result() if (step, rank) in ((0, 1), (1, 1)) else clean
            fd = base.first_divergence
            results.append(replace(base, step=step, rank=rank, target=f"/d/npu/step{step}/rank{rank}",
                                   golden=f"/d/gpu/step{step}/rank{rank}",
                                   first_divergence=fd and replace(fd, step=step, rank=rank)))
    incomplete = [{"step": 2, "rank": 1, "side": "target", "why": "holds no op records"}]
    return merge("/d/npu", "/d/gpu", results, [], incomplete=incomplete)


def test_summary_pairs_carry_their_own_first_divergence(cnn_result):
    result = _multi(cnn_result)
    s = summary_dict(result)
    by = {(p["step"], p["rank"]): p for p in s["pairs"]}
    assert sorted(by) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1)]
    assert by[(0, 0)]["first_divergence"] is None
    fd = by[(1, 1)]["first_divergence"]
    assert fd["name"] == result.first_divergence.name and (fd["step"], fd["rank"]) == (1, 1)
    assert fd["location"]["line"] == result.first_divergence.location.line
    assert s["first_divergence"]["step"] == 0 and s["first_divergence"]["rank"] == 1
    assert s["incomplete"] == [{"step": 2, "rank": 1, "side": "target",
                                "why": "holds no op records"}]


def test_multi_rank_page_grid_and_tables(browser, cnn_result, tmp_path):
    result = _multi(cnn_result)
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        assert page.errors() == []
        grid = page.eval("[...document.querySelectorAll('table.rankgrid tr')].map("
                         "tr => [...tr.children].map(c => c.textContent))")
        assert grid[0] == ["rank \\ step", "0", "1", "2"]
        assert grid[1] == ["0", "error", "error", "absent"]     # errors, but no op to blame
        assert grid[2][0] == "1" and grid[2][1] == "\u2605 divergence"     # the first, marked
        assert grid[2][2] == "divergence" and grid[2][3] == "not compared"
        assert page.eval("document.querySelectorAll('td.gridcell.first').length") == 1
        cells = page.eval("[...document.querySelectorAll('table.pairs tr')].slice(1).map("
                          "tr => [...tr.children].map(c => c.textContent))")
        assert len(cells) == 5
        text = " ".join(" ".join(c) for c in cells)
        assert "NaN" not in text and "{" not in text
        assert cells[1][:3] == ["0", "1", "divergence"]
        assert cells[1][4] == result.first_divergence.name
        assert cells[1][5] == "rank1" and cells[1][6] == "rank1"
        assert "pass" in cells[0][3] and "error" in cells[0][3]
        heads = page.eval("[...document.querySelectorAll('#rows thead th')].map(t => t.textContent)")
        assert heads[1:3] == ["Step", "Rank"]
        first = page.eval("[...document.querySelector('#rows tbody tr.r').children]"
                          ".slice(1, 3).map(c => c.textContent)")
        assert first == ["0", "0"]
    finally:
        page.close()
