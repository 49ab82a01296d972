"""The error per token per layer (issue 45's heatmap): a sequence alone against the same
sequence as a row of a left-padded batch (tiny HF Llama, fp32, tensor dumps, level mix). With
layer 1's MLP activation 1% off, layer 0's output agrees at every real token and layer 1's
differs at every one; the healthy pair agrees everywhere. summary.json holds it (and follows its
schema, loading back), report.html draws it as a table. Before it, nothing measured it."""
from __future__ import annotations

import json

import pytest

import opdiff
from opdiff import schemas
from opdiff.report.html import render_html
from opdiff.report.summary import load_summary


def test_planted_mlp_fault_shows_in_layer_1_only(token_dump, tmp_path):
    result = opdiff.compare(token_dump("left", fault="Functional.silu:1"), token_dump("alone"),
                            progress=False, output_path=str(tmp_path))
    found = result.token_errors
    assert found is not None
    assert found.layers == ("model.layers.0", "model.layers.1")
    assert found.positions == tuple(range(12))          # SEQ's 12 real tokens, padding never
    layer0, layer1 = found.errors
    assert max(layer0) < 1e-6                           # before the fault: the same numbers
    assert min(layer1) > 1e-4                           # 1% of the MLP's output, every token
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["token_errors"]["layers"] == ["model.layers.0", "model.layers.1"]
    pytest.importorskip("jsonschema")
    schemas.validate("compare-summary", summary)
    assert load_summary(tmp_path).token_errors == found
    page = (tmp_path / "report.html").read_text()
    assert '<section id="token-errors"' in page and "<table class=\"heatmap\">" in page
    assert page.count("<tr><th scope=\"row\">model.layers.") == 2
    assert 'title="model.layers.1 position 0: relative error ' in page


def test_healthy_padded_pair_agrees_at_every_token(token_dump):
    result = opdiff.compare(token_dump("right"), token_dump("alone"), progress=False)
    found = result.token_errors
    assert found is not None and len(found.layers) == 2
    assert max(max(row) for row in found.errors) < 1e-5     # fp32 against fp32, other layout


def test_same_layout_draws_no_heatmap(token_dump):
    result = opdiff.compare(token_dump("alone", fault="Functional.silu:1"), token_dump("alone"),
                            progress=False)
    assert result.token_errors is None
    assert 'id="token-errors"' not in render_html(result)
