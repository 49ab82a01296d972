"""The terminal summary of `opdiff check`."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.markup import escape

from .. import terminal
from .engine import CheckResult
from .outputs import not_checked_notes


def print_check(result: CheckResult, console: Optional[Console] = None) -> None:
    """How many ops were checked and failed, the first failure with its source line and why,
    and what could not be checked and why."""
    console = console or terminal.console()   # a dump's control characters shown, not sent
    checked, failed = len(result.checked), len(result.failures)
    colour = "red" if failed else "green"
    console.print(f"[bold]opdiff check[/bold] {escape(result.dump)} ({result.mode} dump"
                  f"{', device ' + escape(result.device) if result.device else ''}): "
                  f"[{colour}]{checked} op(s) checked, {failed} failed[/{colour}], "
                  f"{len(result.not_checked)} not checked, {result.seconds:.1f} s")
    first = result.first_failure
    if first is None:
        if checked:
            console.print("[green]no failure: every checked op is as accurate as a correct CPU "
                          "kernel of its dtype[/green]")
        else:
            console.print("[yellow]nothing could be checked[/yellow]")
    else:
        console.print(f"[red]first failure[/red] (execution order): [bold]{escape(first.name)}"
                      f"[/bold]")
        if first.location:
            loc = first.location
            console.print(f"  at {escape(loc.file)}:{loc.line}"
                          f"{'  ' + escape(loc.code.strip()) if loc.code else ''}")
        console.print(f"  {escape(first.reason)}")
        for other in result.failures[1:6]:
            console.print(f"  also failed: {escape(other.name)}: {escape(other.reason)}")
        if failed > 6:
            console.print(f"  ... {failed - 6} more failure(s) (see the CSV)")
    for line in not_checked_notes(result, limit=5):
        console.print(f"[yellow]{escape(line)}[/yellow]")
    for note in result.notes:
        console.print(f"note: {escape(note)}")
