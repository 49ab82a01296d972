"""The terminal summary of a TrendResult. Red: the runs part or inf/NaN appears; yellow: spikes,
gradual drift, steps the loss scaler skipped; green: nothing found.

    from opdiff.trend.console import print_trend
    print_trend(opdiff.trend.trend("./mon/npu", "./mon/gpu"))
"""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import terminal


def print_trend(result, console: Console | None = None, *, alerts: int = 8) -> None:
    con = console or terminal.console()      # a stream's control characters shown, not sent
    runs = f"{result.target}" + (f" against {result.golden}" if result.golden else "")
    steps = ", ".join(f"{v} {k}" for k, v in result.steps.items())
    con.print(Text(f"Trend of {runs} ({steps} steps)", style="bold"))
    style = ("bold red" if result.found else
             "yellow" if result.verdict == "drift" or result.alerts else "green")
    con.print(Text(result.message, style=style))
    if len(result.ranks) > 1:
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("rank", "verdict", "first step", "where"):
            table.add_column(col)
        for rank, c in sorted(result.ranks.items()):
            d = c.first
            table.add_row(str(rank), c.verdict, str(d.step) if d else "-",
                          Text(f"{d.module} ({d.phase})" if d else "-"))   # not markup
        con.print(table)
    shown = [a for a in result.alerts if a.kind != "scaler_skip"][:alerts]
    if shown and (result.golden is not None or len(shown) > 1):
        con.print(Text("Alerts:", style="bold"))
        for a in shown:
            who = f"{a.run} " if a.run else ""
            colour = "red" if a.kind in ("nan", "inf") else "yellow"
            con.print(Text(f"  {who}rank {a.rank} step {a.step}: {a.kind} in {a.module}",
                           style=colour))
    for e in result.environment_diff[:6]:
        con.print(Text(f"  environment: {e['key']}: {e['target']} (target) vs {e['golden']} "
                       f"(golden)", style="dim"))
