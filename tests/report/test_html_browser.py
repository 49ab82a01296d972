"""report.html in headless Chromium: it draws the verdict, chart, tree and table without script
errors, sorts, filters, links rows to their stacks, and a hostile dump cannot inject markup."""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

from opdiff.comparison.result import CompareResult, TensorRow
from opdiff.report.html import write_html
from opdiff.store.schema import Location

from test_html import EVIL

# ------------------------------------------------------------------------------ in the browser

def test_cnn_report_draws_without_errors(browser, cnn_result, tmp_path):
    result = cnn_result()
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        assert page.errors() == []
        d = result.first_divergence
        assert page.eval("document.querySelector('#verdict .culprit').textContent") == d.name
        assert page.eval("document.querySelector('#verdict .reason').textContent") == d.reason
        hit = page.eval("document.querySelector('#verdict .source .ln.hit').textContent")
        assert hit == f"{d.location.line}{dict(d.context)[d.location.line]}"
        env = page.eval("[...document.querySelectorAll('#verdict table.kv')].pop().textContent")
        assert "npu:0 (Ascend910B)" in env and "autocast" in env
        # the chart: two curves (forward solid, backward dashed), the culprit line, a backward band
        assert page.eval("document.querySelectorAll('#chart-svg path.series.forward').length") == 2
        assert page.eval("document.querySelectorAll('#chart-svg path.series.backward').length") == 2
        assert page.eval("document.querySelectorAll('#chart-svg .backward-band').length") >= 1
        assert page.eval("!!document.getElementById('chart-culprit')")
        assert d.name in page.eval("document.getElementById('chart-svg').textContent")
        # the strip shows red after the culprit and green before it
        assert page.eval("document.querySelectorAll('#chart-svg .strip-error').length") >= 1
        assert page.eval("document.querySelectorAll('#chart-svg .strip-pass').length") >= 1
        # the tree shows the culprit's module, expanded
        assert page.eval("[...document.querySelectorAll('#tree .node')].filter(n => n.querySelector('.tag'))"
                         ".map(n => n.querySelector('.nm').textContent)") == ["conv2"]
        # the table: every row counted, only a window of them in the DOM
        assert page.eval("document.getElementById('rows-shown').textContent") == \
            f"{len(result.rows)} of {len(result.rows)} tensors"
        rendered = page.eval("document.querySelectorAll('#rows tbody tr.r').length")
        assert 10 <= rendered < len(result.rows)
        # hovering the chart names the op under the pointer; clicking opens it in the table
        hover = ("var r = document.querySelector('#chart-svg rect[cursor]').getBoundingClientRect();"
                 "var ev = {clientX: r.left + r.width * 0.75, clientY: r.top + r.height / 2, bubbles: true};"
                 "document.querySelector('#chart-svg rect[cursor]').dispatchEvent(new MouseEvent('{}', ev));")
        page.eval(hover.replace("{}", "mousemove"))
        tip = page.eval("var t = document.querySelector('#chart .tip'); t.hidden ? '' : t.firstChild.textContent")
        m = re.fullmatch(r"#(\d+)  (\S+)", tip)
        assert m and any(r.op_name == m.group(2) and r.index == int(m.group(1)) for r in result.rows), tip
        page.eval(hover.replace("{}", "click"))
        assert page.eval("document.querySelector('#details .title').textContent").startswith(m.group(2) + ".")
        shot = page.screenshot(tmp_path / "report.png")
        assert shot.stat().st_size > 20_000
    finally:
        page.close()


def visible_rows(page) -> list[str]:
    return page.eval("[...document.querySelectorAll('#rows tbody tr.r')].map(t => t.children[1].textContent)")


def test_sorting_and_filtering_in_the_browser(browser, cnn_result, tmp_path):
    result = cnn_result()
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        header = "[...document.querySelectorAll('#rows thead th')].find(t => t.textContent.startsWith('{}'))"
        page.eval(header.format("Cosine") + ".click()")                 # worst cosine first
        by_cos = sorted((r for r in result.rows if r.metrics.get("Cosine") is not None),
                        key=lambda r: r.metrics["Cosine"])
        assert visible_rows(page)[0] == by_cos[0].target_name
        page.eval(header.format("Cosine") + ".click()")                 # then best first
        assert visible_rows(page)[0] == by_cos[-1].target_name
        page.eval(header.format("Cosine") + ".click()")                 # then execution order again
        assert visible_rows(page)[0] == result.rows[0].target_name

        page.eval("var s = document.getElementById('filter-verdict'); s.value = 'error';"
                  "s.dispatchEvent(new Event('change'))")
        n_err = sum(r.result == "error" for r in result.rows)
        assert page.eval("document.getElementById('rows-shown').textContent").startswith(f"{n_err} of")
        assert page.eval("[...document.querySelectorAll('#rows tbody tr.r')]"
                         ".every(t => t.classList.contains('v-error'))")

        page.eval("var q = document.getElementById('filter-name'); q.value = 'LAYER2.0.conv';"
                  "q.dispatchEvent(new Event('input'))")
        expected = [r.target_name for r in result.rows if r.result == "error"
                    and "layer2.0.conv" in (r.target_name or "").lower()]
        assert expected and visible_rows(page) == expected[:len(visible_rows(page))]
        assert page.eval("document.getElementById('rows-shown').textContent").startswith(f"{len(expected)} of")

        page.eval("var s = document.getElementById('filter-verdict'); s.value = 'all';"
                  "s.dispatchEvent(new Event('change'));"
                  "var q = document.getElementById('filter-name'); q.value = '';"
                  "q.dispatchEvent(new Event('input'))")
        # a module in the tree shows its own tensors and its children's
        page.eval("[...document.querySelectorAll('#tree .node')]"
                  ".find(n => n.querySelector('.nm').textContent === 'layer1').click()")
        in_layer1 = [r for r in result.rows
                     if (r.module or "").startswith("Module.layer1.")
                     or (r.kind in ("module", "param_grad") and r.op_name.startswith("Module.layer1."))]
        assert page.eval("document.getElementById('rows-shown').textContent").startswith(f"{len(in_layer1)} of")
        assert page.errors() == []
    finally:
        page.close()


def test_rows_link_to_their_stack(browser, cnn_result, tmp_path):
    result = cnn_result()
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        page.eval("document.querySelector('#rows tbody tr.r button.link').click()")
        row = result.rows[0]
        assert not page.eval("document.getElementById('details').hidden")
        frames = page.eval("[...document.querySelectorAll('#details-stack .frame .loc')].map(e => e.textContent)")
        assert frames == [f"{loc.file}:{loc.line}  in {loc.function}" for loc in row.stack]
        assert page.eval("document.querySelector('#details .title').textContent") == row.target_name
        # "Show in table" brings the culprit's first tensor up and opens it
        page.eval("document.querySelector('#verdict button.jump').click()")
        culprit = result.first_divergence.name
        assert page.eval("document.querySelector('#details .title').textContent").startswith(culprit)
        assert page.eval("document.querySelector('#rows tbody tr.sel').classList.contains('culprit')")
        assert page.errors() == []
    finally:
        page.close()


def test_hostile_dump_cannot_inject_markup(browser, cnn_result, tmp_path):
    result = cnn_result(evil=EVIL)
    result.environment_diff.append({"key": EVIL, "target": EVIL, "golden": "x"})
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        assert page.errors() == []
        assert page.eval("document.querySelectorAll('img').length") == 0
        assert page.eval("document.querySelectorAll('script').length") == 2
        assert page.eval("typeof window.__pwned") == "undefined"
        # the names are shown, as text
        page.eval("var q = document.getElementById('filter-name'); q.value = 'onerror';"
                  "q.dispatchEvent(new Event('input'))")
        names = visible_rows(page)
        assert names and all(EVIL in n for n in names)
        assert EVIL in page.eval("document.getElementById('verdict').textContent")
        page.eval("document.querySelector('#rows tbody tr.r button.link').click()")
        assert EVIL in page.eval("document.getElementById('details-stack').textContent")
        assert page.eval("document.querySelectorAll('img').length") == 0
        assert page.eval("typeof window.__pwned") == "undefined"
    finally:
        page.close()


def test_no_divergence_and_empty_results_render(browser, tmp_path):
    rows = [TensorRow(target_name=f"Functional.relu.{i}.forward.output.0",
                      golden_name=f"Functional.relu.{i}.forward.output.0", op_name=f"Functional.relu.{i}.forward",
                      role="output", phase="forward", kind="api", index=i, metrics={"Cosine": 1.0, "MaxAbsErr": 0.0},
                      result="pass", stack=(Location("t.py", 3, "y = relu(x)"),)) for i in range(5)]
    clean = CompareResult(target="a", golden="b", rows=rows, first_divergence=None, counts={"pass": 5})
    empty = CompareResult(target="a", golden="b", rows=[], first_divergence=None, counts={})
    for name, result in (("clean", clean), ("empty", empty)):
        page = browser.open(write_html(result, tmp_path / f"{name}.html"))
        try:
            assert page.errors() == [], name
            assert page.eval("document.querySelector('#verdict .culprit').textContent") == "No divergence"
            assert page.eval("document.getElementById('tree-card').hidden")        # no modules
        finally:
            page.close()


def test_onnx_rows_render(browser, tmp_path):
    rows = [TensorRow(target_name=f"/layer{i}/Gemm_output_0", golden_name=f"/layer{i}/Gemm_output_0",
                      op_name=f"/layer{i}/Gemm", role="output", phase="forward", kind="node", index=i,
                      target_dtype="float16", golden_dtype="float32", target_shape=(1, 16), golden_shape=(1, 16),
                      metrics={"Cosine": 1 - 10.0 ** (i - 9), "RelEuclideanDistance": 10.0 ** (i - 6)},
                      result="error" if i > 3 else "pass", module=f"blocks.{i // 2}.fc") for i in range(8)]
    result = CompareResult(target="model_fp16.onnx", golden="model.onnx", rows=rows, first_divergence=None,
                           counts={"pass": 4, "error": 4}, title="opdiff onnx")
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        assert page.errors() == []
        assert page.eval("document.querySelector('#header h1').textContent") == "opdiff onnx"
        assert page.eval("document.title") == "opdiff onnx: no divergence"
        assert visible_rows(page)[4] == "/layer4/Gemm_output_0"
        assert page.eval("document.querySelectorAll('#chart-svg path.series').length") == 2
        # ONNX rows carry plain module paths ("blocks.2.fc"): the tree is built from them
        tree = page.eval("[...document.querySelectorAll('#tree .node')].map(n => n.title.split(' ')[0] + ' ' + "
                         "n.querySelector('.dot').classList[1])")
        assert "blocks sev-3" in tree and "blocks.0 sev-0" in tree and "blocks.3 sev-3" in tree
    finally:
        page.close()


@pytest.mark.slow
def test_fifty_thousand_rows_open_fast(browser, fifty_k):
    result, path, _ = fifty_k
    page = browser.open(path)
    try:
        ready_ms = int(page.eval("document.documentElement.getAttribute('data-opdiff-ready')"))
        print(f"50k rows: {path.stat().st_size / 1e6:.1f} MB, load {page.load_seconds:.2f} s, "
              f"script done at {ready_ms} ms")
        assert page.errors() == []
        assert page.load_seconds < 10
        assert page.eval("document.querySelectorAll('#rows tbody tr').length") < 200
        # scrolling to the end renders the last rows
        page.eval("var s = document.getElementById('table-scroll'); s.scrollTop = s.scrollHeight;"
                  "s.dispatchEvent(new Event('scroll'))")
        page.wait_for("[...document.querySelectorAll('#rows tbody tr.r')].pop().children[1].textContent === "
                      + json.dumps(result.rows[-1].target_name))
        # filtering 50k rows is interactive
        took = page.eval("var t = performance.now(); var s = document.getElementById('filter-verdict');"
                         "s.value = 'error'; s.dispatchEvent(new Event('change')); performance.now() - t")
        print(f"filter 50k rows: {took:.0f} ms")
        assert took < 2000
        n_err = sum(r.result == "error" for r in result.rows)
        assert page.eval("document.getElementById('rows-shown').textContent").startswith(f"{n_err:,} of 50,000")
    finally:
        page.close()


# ------------------------------------------------------------------------------ real dumps

def _real_compare(root: Path) -> CompareResult:
    """Dump a small residual CNN twice (one conv's output planted off by 1e-3) and compare."""
    torch = pytest.importorskip("torch")
    import opdiff
    import opdiff.testing
    from torch import nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out += x
            return F.relu(out)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.layer1 = nn.Sequential(Block(8))
            self.layer2 = nn.Sequential(Block(8))
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(self.layer2(self.layer1(F.relu(self.stem(x)))).mean((2, 3)))

    def run(path, fault):
        opdiff.seed_all(0)
        model, x, y = Net(), torch.randn(2, 3, 8, 8), torch.tensor([1, 7])
        planted = opdiff.testing.inject_fault(op="Functional.conv2d", call=4, scale=1 + 1e-3)
        with planted if fault else contextlib.nullcontext():
            with opdiff.dump(model, str(path), level="mix", task="tensor"):
                F.cross_entropy(model(x), y).backward()

    run(root / "golden", False)
    run(root / "target", True)
    return opdiff.compare(str(root / "target"), str(root / "golden"), output_path=str(root / "out"))


@pytest.mark.slow
def test_report_of_a_real_compare(browser, tmp_path):
    result = _real_compare(tmp_path)
    assert result.files.get("html"), "the compare engine did not write report.html"
    d = result.first_divergence
    assert d is not None and d.module and "layer2.0.conv2" in d.module
    page = browser.open(Path(result.files["html"]))
    try:
        assert page.errors() == []
        assert page.eval("document.querySelector('#verdict .culprit').textContent") == d.name
        assert page.eval("document.querySelector('#verdict .source .ln.hit .tx').textContent") == \
            dict(d.context)[d.location.line]
        assert page.eval("!!document.getElementById('chart-culprit')")
        assert page.eval("document.querySelectorAll('#chart-svg path.series').length") >= 1
        tagged = page.eval("[...document.querySelectorAll('#tree .node')].filter(n => n.querySelector('.tag'))"
                           ".map(n => n.title.split(' ')[0])")
        assert tagged == ["layer2.0.conv2"]
        assert page.eval("document.getElementById('rows-shown').textContent") == \
            f"{len(result.rows)} of {len(result.rows)} tensors"
        page.screenshot(tmp_path / "real.png")
    finally:
        page.close()
