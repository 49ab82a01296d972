"""report.html groups a region's rows (the ops the two runs execute differently, both sides) into
one collapsible group, in headless Chromium, on a real compare: an attention module whose target
calls F.scaled_dot_product_attention (planted 2% off) and whose golden computes
softmax(q k^T / sqrt(d)) v by hand."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest

from opdiff.report.html import write_html

SDPA = "Functional.scaled_dot_product_attention"
GOLDEN_OPS = ("Tensor.transpose", "Torch.matmul", "Tensor.__truediv__", "Functional.softmax")


def _attention_compare(root: Path):
    torch = pytest.importorskip("torch")
    import opdiff
    import opdiff.testing
    import torch.nn.functional as F
    from torch import nn

    class Attn(nn.Module):
        def __init__(self, sdpa: bool):
            super().__init__()
            self.sdpa = sdpa
            self.q, self.k, self.v, self.o = (nn.Linear(16, 16) for _ in range(4))

        def forward(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)
            if self.sdpa:
                a = F.scaled_dot_product_attention(q, k, v)
            else:
                a = torch.matmul(F.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(16), dim=-1), v)
            return self.o(a)

    class Net(nn.Module):
        def __init__(self, sdpa: bool):
            super().__init__()
            self.inp, self.attn, self.out = nn.Linear(8, 16), Attn(sdpa), nn.Linear(16, 4)

        def forward(self, x):
            return self.out(F.relu(self.attn(F.relu(self.inp(x)))))

    def run(path: Path, sdpa: bool) -> None:
        opdiff.seed_all(0)
        model, x = Net(sdpa), torch.randn(2, 5, 8)
        planted = opdiff.testing.inject_fault(op=SDPA, call=0, scale=1.02)
        with planted if sdpa else contextlib.nullcontext():
            with opdiff.dump(model, str(path), level="mix", task="tensor"):
                model(x).sum().backward()
        if sdpa:
            assert planted.hits == 1

    run(root / "golden", False)
    run(root / "target", True)
    return opdiff.compare(str(root / "target"), str(root / "golden"), output_path=str(root / "out"))


@pytest.fixture(scope="module")
def attention_report(tmp_path_factory):
    result = _attention_compare(tmp_path_factory.mktemp("regions-report"))
    d = result.first_divergence
    assert d is not None and d.name == "Region.0.forward", d
    assert {r.region for r in result.rows if r.region} == {"region 0 in attn", "region 1 in attn"}
    return result, Path(result.files["html"])


def _show_all_rows(page) -> None:
    """A table tall enough that the virtual window renders every row."""
    page.eval("var s = document.getElementById('table-scroll'); s.style.maxHeight = 'none';"
              "s.style.height = '40000px'; s.dispatchEvent(new Event('scroll'))")
    page.wait_for("document.querySelectorAll('#rows tbody tr.spacer').length === 0")


def _headers(page) -> list[dict]:
    return page.eval("[...document.querySelectorAll('#rows tbody tr.grp')].map(t => ({"
                     "group: t.dataset.group, text: t.textContent, expanded: t.getAttribute('aria-expanded'),"
                     "focusable: t.tabIndex === 0, culprit: t.classList.contains('culprit')}))")


def _names(page) -> list[str]:
    return page.eval("[...document.querySelectorAll('#rows tbody tr.r')].map(t => t.children[1].textContent)")


def _key(page, key: str) -> None:
    """A real key press on the focused element (Input.dispatchKeyEvent, not a synthetic event)."""
    code, vk, text = {"Enter": ("Enter", 13, "\r"), " ": ("Space", 32, " ")}[key]
    for kind in ("keyDown", "keyUp"):
        page.browser.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": code,
                                                     "windowsVirtualKeyCode": vk, "text": text},
                          session=page.session)


@pytest.mark.slow
def test_region_groups_collapse_expand_and_filter(browser, attention_report):
    result, path = attention_report
    fwd_rows = [r for r in result.rows if r.region == "region 0 in attn"]
    bwd_rows = [r for r in result.rows if r.region == "region 1 in attn"]
    page = browser.open(path)
    try:
        assert page.errors() == []
        _show_all_rows(page)
        heads = _headers(page)
        assert len(heads) == 2, heads
        fwd, bwd = heads
        # the header names the region and both sides' ops, its worst verdict, the culprit
        for h in heads:
            assert h["text"].startswith("\u25be region in attn: target " + SDPA + "; golden ") or \
                h["text"].startswith("\u25b8 region in attn: target " + SDPA + "; golden "), h
            golden = h["text"].split("; golden ")[1]
            assert all(op in golden for op in GOLDEN_OPS), h
            assert h["focusable"]
        assert fwd["culprit"] and "culprit" in fwd["text"] and "worst: error" in fwd["text"]
        assert not bwd["culprit"] and "culprit" not in bwd["text"]
        assert f"{len(fwd_rows)} tensors" in fwd["text"] and f"{len(bwd_rows)} tensors" in bwd["text"]
        # the culprit's group starts open, the other closed: its rows are not in the table
        assert (fwd["expanded"], bwd["expanded"]) == ("true", "false")
        names = _names(page)
        assert all((r.target_name or r.golden_name) in names for r in fwd_rows)
        assert not any((r.target_name or r.golden_name) in names for r in bwd_rows)
        inside = page.eval("document.querySelectorAll('#rows tbody tr.r.in-grp').length")
        assert inside == len(fwd_rows)
        # the rows follow their header, both sides' ops among them
        order = page.eval("[...document.querySelectorAll('#rows tbody tr')].map(t => t.classList.contains('grp') ? "
                          "'H' : t.classList.contains('in-grp') ? 'g' : 'r').join('')")
        assert "H" + "g" * len(fwd_rows) in order
        assert any(r.golden_name is None for r in fwd_rows) and any(r.target_name is None for r in fwd_rows)
        # the table still counts tensors, not headers
        assert page.eval("document.getElementById('rows-shown').textContent") == \
            f"{len(result.rows)} of {len(result.rows)} tensors"

        # a click opens the backward group; Enter closes it again; Space opens it
        bwd_sel = f"#rows tbody tr.grp[data-group=\"{bwd['group']}\"]"
        page.eval(f"document.querySelector('{bwd_sel}').click()")
        assert _headers(page)[1]["expanded"] == "true"
        assert all((r.target_name or r.golden_name) in _names(page) for r in bwd_rows)
        page.eval(f"document.querySelector('{bwd_sel}').focus()")
        _key(page, "Enter")
        assert _headers(page)[1]["expanded"] == "false"
        assert page.eval("document.activeElement.dataset.group") == bwd["group"]   # focus stays
        assert not any((r.target_name or r.golden_name) in _names(page) for r in bwd_rows)
        _key(page, " ")
        assert _headers(page)[1]["expanded"] == "true"
        _key(page, "Enter")
        # and the culprit's group closes like any other
        page.eval(f"document.querySelector('#rows tbody tr.grp[data-group=\"{fwd['group']}\"]').focus()")
        _key(page, " ")
        assert [h["expanded"] for h in _headers(page)] == ["false", "false"]
        assert page.eval("document.querySelectorAll('#rows tbody tr.r.in-grp').length") == 0

        # a filter that matches rows inside the closed groups shows those groups open
        page.eval("var q = document.getElementById('filter-name'); q.value = 'softmax';"
                  "q.dispatchEvent(new Event('input'))")
        _show_all_rows(page)
        heads = _headers(page)
        assert [h["expanded"] for h in heads] == ["true", "true"]
        assert f"2 of {len(fwd_rows)} tensors" in heads[0]["text"], heads   # softmax in and out
        shown = _names(page)
        want = [r.golden_name for r in result.rows if "softmax" in (r.golden_name or "")]
        assert shown == want and len(want) == 4, shown
        assert page.eval("document.getElementById('rows-shown').textContent") == \
            f"4 of {len(result.rows)} tensors"
        page.eval("var q = document.getElementById('filter-name'); q.value = '';"
                  "q.dispatchEvent(new Event('input'))")

        # sorting ungroups the rows (and says so); back to unsorted, the groups return
        page.eval("[...document.querySelectorAll('#rows th')].find(t => t.textContent.startsWith('Result')).click()")
        _show_all_rows(page)
        assert _headers(page) == []
        assert "regions ungrouped while sorted" in page.eval("document.getElementById('rows-shown').textContent")
        assert len(_names(page)) == len(result.rows)
        for _ in range(2):      # descending, then unsorted
            page.eval("[...document.querySelectorAll('#rows th')].find(t => t.textContent.startsWith('Result')).click()")
        _show_all_rows(page)
        assert len(_headers(page)) == 2
        assert page.errors() == []
    finally:
        page.close()


@pytest.mark.slow
def test_jump_to_the_culprit_opens_its_group(browser, attention_report):
    result, path = attention_report
    page = browser.open(path)
    try:
        _show_all_rows(page)
        fwd = '#rows tbody tr.grp[data-group="0"]'
        page.eval(f"document.querySelector('{fwd}').click()")     # close the culprit's group
        assert page.eval(f"document.querySelector('{fwd}').getAttribute('aria-expanded')") == "false"
        page.eval("[...document.querySelectorAll('#verdict button')].find(b => /table/i.test(b.textContent)).click()")
        assert page.eval(f"document.querySelector('{fwd}').getAttribute('aria-expanded')") == "true"
        title = page.eval("document.querySelector('#details .title').textContent")
        assert title in {r.target_name or r.golden_name for r in result.rows
                         if r.region == "region 0 in attn"}, title
        assert page.errors() == []
    finally:
        page.close()


def test_a_report_without_regions_has_no_groups(browser, cnn_result, tmp_path):
    result = cnn_result()
    assert not any(r.region for r in result.rows)
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        assert page.errors() == []
        assert page.eval("document.querySelectorAll('#rows tbody tr.grp, #rows tbody tr.in-grp').length") == 0
        assert page.eval("document.getElementById('rows-shown').textContent") == \
            f"{len(result.rows)} of {len(result.rows)} tensors"
        first = page.eval("[...document.querySelectorAll('#rows tbody tr.r')].slice(0, 5).map(t => +t.dataset.row)")
        assert first == [0, 1, 2, 3, 4]
    finally:
        page.close()



@pytest.mark.slow
def test_fifty_thousand_rows_with_regions_stay_fast(browser, large_result, tmp_path):
    """2,500 regions of 4 rows each among 50k rows: the page opens, filters and toggles fast."""
    from dataclasses import replace

    # (the fixture, not `from conftest import`: which conftest that names depends on the run)
    result = large_result(50_000)
    result.rows = [replace(r, region=f"region {i // 20} in layers.{i // 20}.attn")
                   if i % 20 < 4 else r for i, r in enumerate(result.rows)]
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        ready_ms = int(page.eval("document.documentElement.getAttribute('data-opdiff-ready')"))
        print(f"50k rows, 2,500 regions: load {page.load_seconds:.2f} s, script done at {ready_ms} ms")
        assert page.errors() == []
        assert page.load_seconds < 10
        assert page.eval("document.querySelectorAll('#rows tbody tr').length") < 200
        assert page.eval("document.querySelectorAll('#rows tbody tr.grp').length") >= 1
        took = page.eval("var t = performance.now(); var s = document.getElementById('filter-verdict');"
                         "s.value = 'error+warning'; s.dispatchEvent(new Event('change')); performance.now() - t")
        print(f"filter 50k rows with regions: {took:.0f} ms")
        assert took < 2000
        took = page.eval("var t = performance.now(); document.querySelector('#rows tbody tr.grp').click();"
                         "performance.now() - t")
        print(f"toggle a group among 50k rows: {took:.0f} ms")
        assert took < 1000
        assert page.errors() == []
    finally:
        page.close()
