"""The terminal summary of a compare: counts, environment differences, the verdict, the culprit.

Colour carries meaning: red = error, yellow = warning, green = pass, dim = unmatched.

    from opdiff.report.console import print_result
    print_result(result)
"""
from __future__ import annotations

import math
import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

_STYLE = {"pass": "green", "warning": "yellow", "error": "bold red", "unmatched": "dim"}


def _num(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and 0.99 < abs(v) <= 1:
        return f"{v:.6f}"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def print_result(result, console: Console | None = None, *, worst: int = 5) -> None:
    """Print the short verdict of a compare to the terminal (stdout by default)."""
    con = console or Console(highlight=False)
    c = result.counts
    line = Text(f"{result.title}: ", style="bold")
    for key in ("pass", "warning", "error", "unmatched"):
        line.append(f"{c.get(key, 0)} {key}", style=_STYLE[key])
        line.append("  ")
    con.print(line)
    con.print(Text(f"  target {result.target}\n  golden {result.golden}", style="dim"))
    if result.environment_diff:
        con.print(Text("Environment differs:", style="yellow"))
        for d in result.environment_diff[:12]:
            con.print(Text(f"  {d['key']}: {d['target']}  vs  {d['golden']}"))
        if len(result.environment_diff) > 12:
            con.print(Text(f"  ... and {len(result.environment_diff) - 12} more", style="dim"))
    for note in result.notes:
        con.print(Text(f"note: {note}", style="yellow"))

    fd = result.first_divergence
    if fd is None:
        con.print(Text(result.verdict or "no divergence found", style="green"))
    else:
        head = Text("First divergence: ", style="bold red")
        head.append(fd.name, style="bold")
        if fd.step is not None or fd.rank is not None:
            head.append(f" (step {fd.step}, rank {fd.rank})")
        con.print(head)
        con.print(Text(f"  {fd.reason}"))
        if fd.location is not None:
            where = Text(f"  at {fd.location.file}:{fd.location.line}", style="cyan")
            if fd.location.code:
                where.append(f"  `{fd.location.code.strip()}`", style="bold")
            con.print(where)
            for n, text in fd.context:
                mark = ">" if n == fd.location.line else " "
                con.print(Text(f"  {mark} {n:5d} | {text}",
                               style="bold" if mark == ">" else "dim"))
        if fd.module:
            con.print(Text(f"  inside {fd.module}", style="dim"))
    bad = [r for r in result.rows if r.result == "error"]
    if bad and worst:
        table = Table(title="errors (first in execution order)", title_justify="left")
        for col in ("tensor", "cosine", "max abs err", "rel err", "why"):
            table.add_column(col, overflow="fold")
        for r in bad[:worst]:
            table.add_row(Text(r.target_name or r.golden_name or "", style="red"),
                          _num(r.metrics.get("Cosine")), _num(r.metrics.get("MaxAbsErr")),
                          _num(r.error), r.reason[:160])
        con.print(table)
    if result.files:
        con.print(Text("Wrote " + ", ".join(os.path.basename(p) for p in result.files.values())
                       + f" to {os.path.dirname(next(iter(result.files.values())))}", style="dim"))
