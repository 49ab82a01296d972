"""report.html's heatmap of the error per token per layer (`CompareResult.token_errors`, made
where two runs laid the same tokens out differently): one row per layer, one column per token
position of the matched sequence, each cell coloured by log10 of its relative error (pale: at
or below 1e-7, red: 1e-1 and above), its number in the cell's title.

Drawn here as static HTML, every name escaped, so it needs none of the page's script::

    section = heatmap_section(result)       # "" without token errors
"""
from __future__ import annotations

import html
import math
from typing import Any

_LOW, _HIGH = -7.0, -1.0        # log10 of the errors at the two ends of the colour scale


def _colour(error: float) -> str:
    if math.isnan(error):
        return "#888888"
    level = _LOW if error <= 0 else min(max(math.log10(error), _LOW), _HIGH) \
        if math.isfinite(error) else _HIGH
    x = (level - _LOW) / (_HIGH - _LOW)       # 0 pale .. 1 red
    return f"hsl({round(60 * (1 - x))}, 90%, {round(95 - 45 * x)}%)"


def heatmap_section(result: Any) -> str:
    """The heatmap as a <section> of the page, or "" when the result holds no token errors."""
    found = getattr(result, "token_errors", None)
    if found is None or not found.layers:
        return ""
    head = "".join(f"<th scope=\"col\">{p}</th>" for p in found.positions)
    body = []
    for layer, errors in zip(found.layers, found.errors):
        cells = "".join(f"<td style=\"background:{_colour(e)}\" title=\"{html.escape(layer)} "
                        f"position {p}: relative error {e:.3g}\"></td>"
                        for p, e in zip(found.positions, errors))
        body.append(f"<tr><th scope=\"row\">{html.escape(layer)}</th>{cells}</tr>")
    return ("<section id=\"token-errors\" class=\"card\" aria-label=\"Error per token per "
            "layer\">\n    <h2>Error per token per layer</h2>\n    <p>Relative error of each "
            "layer's output at each real token of the first matched sequence, target against "
            "golden (pale: 1e-7 or less, red: 1e-1 or more; hover a cell for its number).</p>\n"
            "    <div class=\"heatmap-scroll\"><table class=\"heatmap\"><thead><tr><th>layer \\ "
            f"position</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>\n"
            "  </section>\n  ")


__all__ = ["heatmap_section"]
