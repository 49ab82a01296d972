"""The HTML verdict box says where the difference comes from: "Inputs agree, outputs do not"
only for an op's own error, not for a parameter that differs before any op reads it, nor for
parameters carried over from an earlier diverging step."""
import json
from dataclasses import replace

import pytest

from opdiff.report.html import write_html


def _carried(reason: str):
    """The step a made-up divergence says it was carried over from (Divergence.carried_from)."""
    return 0 if "carried over from step 0" in reason else None


@pytest.mark.parametrize("origin, reason, heading", [
    ("op", "inputs agree, output does not — local error in this op",
     "Inputs agree, outputs do not"),
    ("parameter", "parameter fc.weight differs before any op uses it: the runs do not start "
                  "from the same weights", "A parameter differs before any op reads it"),
    ("parameter", "3 of 6 parameters differ at the start of step 2, carried over from step 0, "
                  "which diverged at Functional.linear.1.forward",
     "Parameters carried over from an earlier step"),
    ("optimizer", "the optimizer's update differs", "The optimizer's update differs"),
])
def test_heading_follows_the_origin(browser, cnn_result, tmp_path, origin, reason, heading):
    result = cnn_result()
    result.first_divergence = replace(result.first_divergence, origin=origin, reason=reason,
                                      carried_from=_carried(reason))
    page = browser.open(write_html(result, tmp_path / "report.html"))
    try:
        assert page.errors() == []
        assert page.eval("document.querySelector('#verdict h3:last-of-type') && "
                         "[...document.querySelectorAll('#verdict h3')].map(h => h.textContent)"
                         ".includes(" + json.dumps(heading) + ")"), heading
        if origin != "op":
            assert "Inputs agree, outputs do not" not in page.eval(
                "document.getElementById('verdict').textContent")
    finally:
        page.close()


def test_payload_carries_the_origin(cnn_result):
    from opdiff.report.payload import build_payload
    result = cnn_result()
    result.first_divergence = replace(result.first_divergence, origin="parameter")
    assert build_payload(result)["divergence"]["origin"] == "parameter"


@pytest.mark.parametrize("origin, reason, heading", [
    ("op", "", "Inputs agree, outputs do not"),
    ("parameter", "differs before any op", "A parameter differs before any op reads it"),
    ("parameter", "... carried over from step 0, ...", "Parameters carried over from an earlier step"),
    ("number", "", "Its number arguments differ"),
    ("region", "", "Inputs agree, outputs do not"),
    ("collective", "", "Received through a collective"),
    ("", "", "Inputs agree, outputs do not"),
])
def test_heading_without_a_browser(cnn_result, origin, reason, heading):
    """The same headings, as the payload gives them to report.js (comparison/origins.py's
    RULES), and the worst input's label: "(if any)" unless the op's own error."""
    from opdiff.report.payload import build_payload
    result = cnn_result()
    result.first_divergence = replace(result.first_divergence, origin=origin, reason=reason,
                                      carried_from=_carried(reason))
    d = build_payload(result)["divergence"]
    assert d["heading"] == heading
    assert d["input_optional"] is (origin not in ("op", ""))
