"""How the demo talks: a short numbered story, the shared reporters' verdict, then what to do next.

Nothing here computes a result; it only tells what the scenarios did and what the pipeline found.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.padding import Padding
from rich.syntax import Syntax
from rich.text import Text



@dataclass(frozen=True)
class Advice:
    """"On your own model": how to record (a snippet), then what to run on the recording."""
    hint: str
    snippet: str
    then: str
    command: str


COMPARE_ADVICE = Advice(
    hint="record one training step on each side (./dump/golden on the trusted one):",
    snippet='dbg = opdiff.PrecisionDebugger(dump_path="./dump/target", level="mix")\n'
            'dbg.start(model); ...one training step...; dbg.stop(); dbg.step()',
    then="then:",
    command="opdiff compare ./dump/target ./dump/golden -o ./out")
OVERFLOW_ADVICE = Advice(
    hint="train under the overflow check (it stops at the origin with OverflowDetected):",
    snippet='dbg = opdiff.PrecisionDebugger(dump_path="./dump", task="overflow_check")\n'
            'dbg.start(model); ...training steps...; dbg.stop(); dbg.step()',
    then="or analyse any statistics dump offline:",
    command="opdiff overflow ./dump -o ./out")


class Story:
    """Numbered steps on a rich console; `console=None` prints to stdout."""

    def __init__(self, console: Console | None = None):
        if console is None:      # (imported here: `opdiff demo --list` need not load the report)
            from ..report.console import stdout_console
            console = stdout_console()       # piped: lines are not wrapped
        self.console = console
        self.number = 0

    def title(self, text: str, subtitle: str) -> None:
        self.console.print(Text(text, style="bold"))
        self.console.print(Text(subtitle, style="dim"))
        self.console.print()

    def step(self, text: str, *details: str) -> None:
        self.number += 1
        line = Text(f"{self.number}. ", style="bold cyan")
        line.append(text)
        self.console.print(line)
        for d in details:
            self.console.print(Text(f"   {d}", style="dim"))

    @contextmanager
    def working(self, text: str):
        """A spinner while something slow runs (only on a terminal)."""
        if self.console.is_terminal:
            with self.console.status(text):
                yield
        else:
            yield

    def verdict(self, printer, result) -> None:
        """Print `result` with a shared reporter (`print_result`, `print_overflow`), indented."""
        self.console.print()
        printer(result, console=self.console)
        self.console.print()

    def check(self, found: bool, text: str) -> None:
        """Say whether the pipeline's answer is the truth the scenario planted."""
        mark, style = ("✔", "green") if found else ("✘", "bold red")
        self.console.print(Text(f"{mark} {text}", style=style))

    def closing(self, files: dict, seconds: float, advice: Advice = COMPARE_ADVICE) -> None:
        con = self.console
        con.print()
        con.print(Text(f"Done in {seconds:.1f} s. Files:", style="bold"))
        width = max(len(k) for k in files) if files else 0
        for label, path in files.items():
            con.print(Text(f"  {label:<{width}}  {_shown(path)}"))
        if "report.html" in files:
            con.print(Text(f"  open {_shown(files['report.html'])} in a browser: the verdict, an "
                           f"error chart along execution order, the module tree and every tensor",
                           style="dim"))
        con.print()
        con.print(Text("On your own model:", style="bold"))
        con.print(Text(f"  {advice.hint}", style="dim"))
        if con.is_terminal:
            con.print(Padding(Syntax(advice.snippet, "python", theme="ansi_dark",
                                     background_color="default", word_wrap=True), (0, 0, 0, 4)))
        else:   # piped: Syntax pads every line to the (unbounded) width of an unwrapped console
            for line in advice.snippet.splitlines():
                con.print(Text(f"    {line}"))
        con.print(Text(f"  {advice.then}", style="dim"))
        con.print(Text(f"    {advice.command}", style="bold"))


def _shown(path) -> str:
    """A path relative to the working directory when it is inside it (shorter to read and type)."""
    path = os.fspath(path)
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return rel if not rel.startswith("..") else path
