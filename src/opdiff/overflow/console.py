"""The terminal summary of an overflow analysis. Red: an op created inf/NaN; yellow: warnings
(skipped by the loss scaler, fp16 headroom); green: clean.

    from opdiff.overflow.console import print_overflow
    print_overflow(opdiff.overflow.analyze("./dump"))
"""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import terminal
from .result import CLEAN, DISCARDED, INHERITED, OVERFLOW, SKIPPED

_STYLE = {OVERFLOW: "bold red", INHERITED: "bold red", SKIPPED: "yellow", DISCARDED: "yellow",
          CLEAN: "green"}


def print_overflow(result, console: Console | None = None, *, chain: int = 8, headroom: int = 8) -> None:
    """Print the origin, the start of its chain, per-step verdicts and the top headroom warnings."""
    con = console or terminal.console()      # a dump's control characters shown, not sent
    con.print(Text(f"Overflow check of {result.dump}: {result.status}", style=_STYLE[result.status]))
    origin = result.origin
    first = next((s for s in result.steps if s.status in (OVERFLOW, INHERITED)), None)
    if origin is not None:
        head = Text("Origin: ", style="bold red")
        head.append(origin.name, style="bold")
        head.append(f" ({origin.phase}, step {origin.step}, rank {origin.rank})")
        con.print(head)
        con.print(Text(f"  {origin.nonfinite} created: {origin.reason}"))
        if origin.location is not None:
            loc = origin.location
            con.print(Text(f"  at {loc.file}:{loc.line}  {loc.code}", style="cyan"))
        if origin.module:
            con.print(Text(f"  in {origin.module}", style="dim"))
        for t in origin.inputs[:4] + origin.outputs[:4]:
            con.print(Text(f"  {t['name']}: {t['dtype']} {t['shape']} max={t['max']} min={t['min']} "
                           f"nan={t['nan']} inf={t['inf']}", style="dim"))
        if first is not None and first.chain:
            con.print(Text(f"Spread through {first.counts.get('chain', len(first.chain))} op(s):"))
            for link in first.chain[:chain]:
                con.print(Text(f"  {link.name}  ({link.relation})"))
            rest = first.counts.get("chain", len(first.chain)) - min(chain, len(first.chain))
            if rest > 0:
                con.print(Text(f"  ... and {rest} more (all of them in overflow.json, with -o)",
                               style="dim"))
    if len(result.steps) > 1 or origin is None:
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("step", "rank", "status", "finding"):
            table.add_column(col)
        for s in result.steps:
            table.add_row(str(s.step), str(s.rank), Text(s.status, style=_STYLE[s.status]),
                          Text(s.message))       # not markup: it names ops from the dump
        con.print(table)
    if result.headroom:
        con.print(Text(f"fp16 headroom: {len(result.headroom)} op(s) at or beyond "
                       f"1/{result.headroom_factor:g} of the limit", style="yellow"))
        for w in result.headroom[:headroom]:
            where = f"  [{w.location.file}:{w.location.line}]" if w.location else ""
            step = f"step {w.step}: " if w.step is not None else ""
            con.print(Text(f"  {step}{w.name} ({w.dtype}): {w.message}{where}"))
