"""After the first divergence, rows say how they relate to it, and the verdict box's heading says
what the evidence shows (issue 46, item 6).

A ResNet-18 fed one changed input value, recorded as statistics: the input is the origin, and
the 20-70 convolutions and batch norms after it, whose inputs already differ, each showed an
output difference "an order of magnitude" above their inputs' statistics, as "local error".
Statistics cannot tell that from the input's difference amplified: those rows are inherited
from the first divergence. Without module hooks (level L1) no leaf record holds the input, and
the first conv is named: over inputs whose statistics differ, report.html must not head it
"Inputs agree, outputs do not"."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import opdiff
from opdiff.report.html import write_html

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "falsepos"))
from test_statistics_families import ResNet18  # noqa: E402


def _run(path, level, changed):
    opdiff.seed_all(1234)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    model = ResNet18()
    if changed:
        x[0, 0, 0, 0] += 0.2
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="statistics", level=level, step=[0])
    dbg.start(model if level == "mix" else None)    # (L1 without the model: no leaf records)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    dbg.stop()
    dbg.step()
    return path


@pytest.fixture(scope="module", params=["mix", "L1"])
def changed_input(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return request.param, opdiff.compare(_run(root / "t", request.param, True),
                                         _run(root / "g", request.param, False))


@pytest.mark.slow
def test_rows_after_the_first_divergence_say_they_follow_from_it(changed_input):
    level, result = changed_input
    fd = result.first_divergence
    assert fd is not None
    if level == "mix":
        assert fd.origin == "input", result.verdict
    errors = [r for r in result.rows if r.result == "error"]
    assert all(r.op_name == fd.name or r.leaf for r in errors), [
        (r.target_name, r.reason) for r in errors if r.op_name != fd.name][:5]
    after = [r for r in result.rows if "first divergence" in (r.reason or "")]
    assert after, "the ops an order of magnitude off after the origin are not related to it"
    assert all(f"inherited from the first divergence {fd.name}" in r.reason
               and not r.reason.startswith("local error") for r in after)


@pytest.mark.slow
def test_heading_matches_the_inputs_evidence(changed_input, tmp_path):
    level, result = changed_input
    html = write_html(result, tmp_path / "report.html").read_text()
    page = json.dumps(html)      # (the payload's strings, as the page holds them)
    if level == "mix":
        assert "An input differs before any op reads it" in page
    else:
        assert result.first_divergence.origin == "op"
        assert any(v for k, v in result.first_divergence.input_metrics.items() if "diff" in k)
        assert "Its output differs more than its inputs do" in page
    assert "Inputs agree, outputs do not" not in page
