"""The terminal summary of a compare: counts, environment differences, the verdict, the culprit.

Colour carries meaning: red = error, yellow = warning, green = pass, dim = unmatched.

    from opdiff.report.console import print_result
    print_result(result)
"""
from __future__ import annotations

import os
import sys
import time
from itertools import islice

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..comparison.result import ERROR, WARNING, CompareResult, Note, note_kind
from ..numbers import human
from ..terminal import console as _safe_console
from ..terminal import one_line, safe

_STYLE = {"pass": "green", "warning": "yellow", "error": "bold red", "unmatched": "dim"}


def stdout_console() -> Console:
    """A rich Console on stdout. On a terminal it wraps to the terminal's width; into a pipe or
    a file it does not wrap at all (rich would wrap at 80 columns), so `grep` and scripts see
    every line whole. It is an `opdiff.terminal.SafeConsole`: control characters and escape
    sequences from a dump are shown, not sent to the terminal."""
    return _safe_console()


def print_result(result, console: Console | None = None, *, worst: int = 5) -> None:
    """Print the short verdict of a compare to the terminal (stdout by default, see
    `stdout_console`). Names, paths, source lines and messages come from the dumps: they are
    printed as plain text (no rich markup) with their control characters made visible."""
    con = console or stdout_console()
    c = result.counts
    line = Text(f"{result.title}: ", style="bold")
    for key in ("pass", "warning", "error", "unmatched"):
        line.append(f"{c.get(key, 0)} {key}", style=_STYLE[key])
        line.append("  ")
    con.print(line)
    con.print(Text(f"  target {one_line(result.target)}\n  golden {one_line(result.golden)}",
                   style="dim"))
    if result.environment_diff:
        con.print(Text("Environment differs:", style="yellow"))
        for d in result.environment_diff[:12]:
            con.print(Text(one_line(f"  {d['key']}: {d['target']}  vs  {d['golden']}")))
        if len(result.environment_diff) > 12:
            con.print(Text(f"  ... and {len(result.environment_diff) - 12} more", style="dim"))
    for note in result.notes:
        con.print(Text(f"note: {safe(note)}", style="yellow"))

    fd = result.first_divergence
    if fd is None:
        # (an inconclusive verdict in yellow: never as healthy-looking as agreement)
        style = "yellow" if verdict_kind(result) == INCONCLUSIVE else "green"
        con.print(Text(safe(result.verdict or verdict_line(result)), style=style))
    else:
        head = Text("First divergence: ", style="bold red")
        head.append(one_line(fd.name), style="bold")
        if fd.step is not None or fd.rank is not None:
            head.append(f" (step {fd.step}, rank {fd.rank})")
        con.print(head)
        con.print(Text(f"  {safe(fd.reason)}"))
        if _region_lines(con, fd):
            pass
        elif fd.location is not None:
            where = Text(f"  at {one_line(fd.location.file)}:{fd.location.line}", style="cyan")
            if fd.location.code:
                where.append(f"  `{one_line(fd.location.code.strip())}`", style="bold")
            con.print(where)
            for n, text in fd.context:
                mark = ">" if n == fd.location.line else " "
                con.print(Text(f"  {mark} {n:5d} | {one_line(text)}",
                               style="bold" if mark == ">" else "dim"))
        if fd.module:
            con.print(Text(f"  inside {one_line(fd.module)}", style="dim"))
    # (the first `worst` only: a many-rank result's rows are streamed from disk, not copied)
    bad = list(islice((r for r in result.rows if r.result == "error"), worst)) if worst else []
    if bad:
        table = Table(title="errors (first in execution order)", title_justify="left")
        for col in ("tensor", "cosine", "max abs err", "rel err", "why"):
            table.add_column(col, overflow="fold")
        for r in bad[:worst]:
            table.add_row(Text(one_line(r.target_name or r.golden_name or ""), style="red"),
                          human(r.metrics.get("Cosine")), human(r.metrics.get("MaxAbsErr")),
                          human(r.error), Text(one_line(r.reason[:160])))
        con.print(table)
    if result.files:
        con.print(Text("Wrote " + ", ".join(os.path.basename(p) for p in result.files.values())
                       + f" to {os.path.dirname(next(iter(result.files.values())))}", style="dim"))


def _region_lines(con: Console, fd) -> bool:
    """A region's source lines of both sides, one `target: FILE:LINE` / `golden: FILE:FIRST-LAST`
    per file (clickable in most terminals and editors), the lines under it; the target's first
    with the lines around it, as an op's line is. False when the divergence holds none."""
    from ..comparison.region_verdict import spans

    region = fd.region if isinstance(fd.region, dict) else {}
    sides = [(side, spans(region.get(f"{side}_locations") or [])) for side in ("target", "golden")]
    if not any(found for _, found in sides):
        return False
    loc = fd.location
    if loc is not None and not any(file == loc.file and loc.line in dict(lines)
                                   for file, _, _, lines in sides[0][1]):
        # the divergence's own line first (a compiled kernel's: the user's line it came from)
        sides[0] = ("target", [(loc.file, loc.line, loc.line, [(loc.line, loc.code)]),
                               *sides[0][1]])
    around = dict(fd.context) if loc is not None else {}
    for side, found in sides:
        for file, first, last, lines in found:
            head = Text(f"  {side}: {one_line(file)}:{first}" + (f"-{last}" if last != first else ""),
                        style="cyan")
            if len(lines) == 1 and lines[0][1]:
                head.append(f"  `{one_line(lines[0][1].strip())}`", style="bold")
            con.print(head)
            here = around if around and side == "target" and file == loc.file \
                and any(n in around for n, _ in lines) else {}
            listed = dict(lines)
            shown = sorted(set(here) | (set(listed) if len(lines) > 1 or here else set()))
            if here:    # (lines the dump's context skips between its own are blank)
                shown = sorted(set(shown) | set(range(min(here), max(here) + 1)))
            for k, n in enumerate(shown):
                if k and n > shown[k - 1] + 1:
                    con.print(Text("            ...", style="dim"))
                mark = ">" if n in listed else " "
                con.print(Text(f"    {mark} {n:5d} | {one_line(here.get(n) or listed.get(n) or '')}",
                               style="bold" if mark == ">" else "dim"))
            around = {} if here else around     # (the context once)
    return True


def _inconclusive(note: str) -> str:
    """An inconclusive note as the verdict: "inconclusive: ..." first, also where the note is
    said again with where it holds ("step 1 rank 0: inconclusive: ...", comparison/runs.py)."""
    word = "inconclusive: "
    text = str(note)
    return text if text.startswith(word) else word + text.replace(word, "", 1)


# What a compare's verdict is, in one word each (`verdict_kind`): the terminal's colour and the
# HTML page's verdict box follow it, so neither looks healthier than the sentence it shows.
DIVERGENCE, INCONCLUSIVE, EXPLAINED, AGREE = "divergence", "inconclusive", "explained", "agree"
VERDICT_KINDS = (DIVERGENCE, INCONCLUSIVE, EXPLAINED, AGREE)


def verdict_line(result: CompareResult) -> str:
    """One sentence on what the compare found."""
    return _verdict(result)[1]


def verdict_kind(result: CompareResult) -> str:
    """What `verdict_line` says, in one of `VERDICT_KINDS`: a culprit (divergence), nothing can
    be claimed (inconclusive), differences that their inputs and dtype explain (explained), or
    every compared tensor within tolerance (agree)."""
    return _verdict(result)[0]


def _verdict(result: CompareResult) -> tuple[str, str]:
    from ..comparison.reasons import incomparable_ops
    from ..comparison.result import MIN_COVERAGE

    fd = result.first_divergence
    covered = result.coverage
    cut = [(p, c) for p in result.pairs or [] if isinstance(p, dict) for c in p.get("cut") or []]
    if fd is None and cut:      # a side ends early (killed, disk full): the rest is unknown
        from ..comparison.runs import cut_words
        p, c = cut[0]
        return INCONCLUSIVE, (f"inconclusive: step {p['step']} rank {p['rank']}: "
                              f"{cut_words(c['side'], c)}; no divergence among the records "
                              f"before it (see the notes)")
    said = next((n for n in result.notes if note_kind(n) == Note.INCONCLUSIVE), None)
    if fd is None and said:     # e.g. compiled code recorded unlike eager code (comparison/compiled.py)
        return INCONCLUSIVE, _inconclusive(said)
    if fd is None and covered is not None and covered < MIN_COVERAGE:
        # Most tensors were not compared at all: finding nothing among the rest proves little.
        return INCONCLUSIVE, (
            f"inconclusive: only {100 * covered:.0f}% of tensors have a partner in the other "
            f"dump (below {100 * MIN_COVERAGE:.0f}%), and none of those diverges; the rest "
            f"was not compared (different ops ran: compiled vs eager, another level or model?)")
    if fd is None:
        # Statistics cannot show small errors: say so rather than claim the run is clean.
        caveat = (" — as far as statistics can tell (see the note on their limits)"
                  if any(r.mode == "statistics" for r in result.rows) else "")
        if _same_dump(result):      # a mistake more often than a test: say it
            return AGREE, (f"no divergence: {result.target} was compared with itself (TARGET "
                           "and GOLDEN are the same dump); pass the other run's dump as GOLDEN")
        if incomparable_ops(result.rows):
            return INCONCLUSIVE, ("inconclusive: the runs were sharded differently (see the "
                                  "note); no op is blamed among the tensors that compare" + caveat)
        if result.counts.get(ERROR, 0) or result.counts.get(WARNING, 0):
            return EXPLAINED, ("no op is to blame: every difference is explained by the op's "
                               "inputs and the precision of its dtype (error grows gradually)"
                               + caveat)
        return AGREE, "no divergence: every compared tensor agrees with golden" + caveat
    where = ""
    if fd.location is not None:
        where = f" — {os.path.basename(fd.location.file)}:{fd.location.line}"
        if fd.location.code:
            where += f" `{fd.location.code.strip()}`"
    scope = ""
    if fd.step is not None or fd.rank is not None:
        scope = f" (step {fd.step}, rank {fd.rank})"
    return DIVERGENCE, f"{fd.name}{scope}: {fd.reason}{where}"


def _same_dump(result: CompareResult) -> bool:
    """Are TARGET and GOLDEN one and the same directory (by the file system, not by spelling)?"""
    try:
        return os.path.samefile(result.target, result.golden)
    except (OSError, TypeError, ValueError):    # gone, or not paths (a loaded summary)
        return False


class Progress:
    """A rich progress bar on stderr that appears only when the compare is slow enough to need
    one, and only on a terminal (piped or redirected stderr stays quiet unless `mode` is True).

    total: op records to compare; pairs: step/rank pairs (above 1, the bar also counts them:
    "comparing 3/8 step/rank pairs", advanced by `pair_done`, for either engine)."""

    DELAY_S = 1.5

    def __init__(self, total: int, mode: bool | None, pairs: int = 0):
        self.total, self.mode, self.pairs = total, mode, pairs
        self.done = 0
        self.pairs_done = 0
        self.start = time.monotonic()
        self.bar = None
        self.task = None

    def __enter__(self):
        if self.mode is True:
            self._open()
        return self

    def description(self) -> str:
        """What the bar says it is counting."""
        if self.pairs > 1:
            return f"comparing {self.pairs_done}/{self.pairs} step/rank pairs"
        return "comparing ops"

    def _open(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        from ..terminal import SafeConsole

        self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                            MofNCompleteColumn(), TimeRemainingColumn(),
                            console=SafeConsole(stderr=True), transient=True)
        self.bar.start()
        self.task = self.bar.add_task(self.description(), total=self.total or None,
                                      completed=self.done)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.bar is None:
            if (self.mode is None and sys.stderr.isatty()
                    and time.monotonic() - self.start > self.DELAY_S):
                self._open()
            return
        self.bar.update(self.task, completed=self.done)

    def pair_done(self, _pair=None) -> None:
        """One more step/rank pair finished (the argument, the pair, is not needed)."""
        self.pairs_done += 1
        if self.bar is not None:
            self.bar.update(self.task, description=self.description())

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
