"""report.html's "Rank layouts" section: what was merged of each side laid out over ranks, and
how (`CompareResult.layouts`, `comparison.layouts.facts.LayoutFacts`): one table row per side
and step, static HTML, every name escaped, so it needs none of the page's script::

    section = layouts_section(result)       # "" when no side was laid out over ranks
"""
from __future__ import annotations

import html
from typing import Any

_REPLICAS = 3           # differing replicas named in a cell; the rest counted


def _cell(text: str) -> str:
    return f"<td>{html.escape(text)}</td>"


def _replicas(facts: Any) -> str:
    shown = [f"rank {r.rank}'s {r.tensor} (against rank {r.against}'s)"
             for r in facts.replicas[:_REPLICAS]]
    more = len(facts.replicas) - len(shown)
    return "; ".join(shown + ([f"{more} more"] if more > 0 else [])) or "none"


def _row(f: Any) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(f.counts.items())) or "-"
    mesh = f" ({' x '.join(map(str, f.mesh))} mesh)" if f.mesh else ""
    culprit = ", ".join(f"rank {r}" for r in f.culprit_ranks) or "-"
    return ("<tr>" + _cell(f.side) + _cell("" if f.step is None else str(f.step)) +
            _cell(", ".join(f.kinds) + mesh) + _cell(f"{f.how}: ranks {list(f.ranks)} of "
                                                      f"{f.world}") +
            _cell(counts) + _cell(str(f.left_out)) + _cell(_replicas(f)) + _cell(culprit) +
            "</tr>")


def layouts_section(result: Any) -> str:
    """The section as a <section> of the page, or "" when the result holds no layout facts."""
    found = getattr(result, "layouts", None) or []
    if not found:
        return ""
    head = "".join(f"<th scope=\"col\">{h}</th>" for h in (
        "side", "step", "layout", "ranks", "tensors merged", "layout records left out",
        "replicas that differ", "culprit's rank"))
    return ("<section id=\"rank-layouts\" class=\"card\" aria-label=\"Rank layouts\">\n"
            "    <h2>Rank layouts</h2>\n    <p>Each side run over several ranks was made into "
            "one run before comparing: what each side's ranks were and what was done with "
            "them.</p>\n    <div class=\"heatmap-scroll\"><table class=\"layouts\"><thead><tr>"
            f"{head}</tr></thead><tbody>{''.join(map(_row, found))}</tbody></table></div>\n"
            "  </section>\n  ")


__all__ = ["layouts_section"]
