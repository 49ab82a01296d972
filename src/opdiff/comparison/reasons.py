"""Why, in English: the sentences that say why an op is blamed, why a row is only a warning, and
what a compare of statistics alone cannot see. The rules that decide are in
`opdiff.comparison.blame`; nothing here decides anything.

    from opdiff.comparison.reasons import describe
    describe(op, rows)   # "inputs agree (cosine 1.000000, rel err 0), output does not (...) — local error in this op"

Tests assert on `Divergence.kind` and the culprit's name, not on these phrases.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import TYPE_CHECKING, Any, Iterable, Optional, TypeVar, cast

from ..errors import OpdiffError
from ..numbers import human
from ..store import dumpfiles
from ..store.schema import Location, Phase, Placement
from . import forced
from .result import NONFINITE, REPLAY, SCALE, LOCAL, INTEGER, UNMATCHED, TensorRow
from .verdicts import run_precision

if TYPE_CHECKING:       # (blame imports this module: no import at run time)
    from .blame import OpScore
    from .verdicts import Policy

LOCAL_VERDICT = "local error in this op"
log = logging.getLogger("opdiff")
_D = TypeVar("_D")        # a Divergence, or None


def describe(op: "OpScore", rows: list[TensorRow], inputs: str = "") -> str:
    """The one sentence that says why `op` is the culprit. `inputs`: what its inputs are, in
    words (a region's "`query`, `key`, `value` of `Functional.scaled_dot_product_attention`",
    `region_verdict.input_words`), said where the sentence speaks of them."""
    if op.arg_diffs and op.blame != REPLAY:
        return _describe_error(op, rows, (
            f"its number arguments differ ({', '.join(op.arg_diffs[:3])}): the difference enters "
            f"the computation here, through them"), inputs)
    return _describe_error(op, rows, inputs=inputs)


def _stat_pair(row: TensorRow, key: str) -> str:
    return f"{human(row.target_stats.get(key))} vs {human(row.golden_stats.get(key))}"


def describe_statistics(op: "OpScore", out: TensorRow, inp: Optional[TensorRow],
                        verdict: str, named: str = "") -> str:
    """The reason when only statistics were compared: no cosine or max abs err to quote.
    `named`: the inputs in words (`describe`)."""
    said = f" ({named})" if named else ""
    if inp is None:
        inputs = "no inputs to compare, the output's statistics differ"
    elif op.error_in == 0:
        inputs = f"the inputs' statistics agree exactly{said}, the output's do not"
    elif inp.accuracy_reached != "No":     # within its tolerance
        inputs = (f"the inputs' statistics agree ({named + '; ' if named else ''}worst differs "
                  f"by {human(op.error_in)} of its size), the output's do not")
    else:       # inputs that differ already, by an order of magnitude less than the output
        inputs = (f"the inputs' statistics differ by at most {human(op.error_in)} of their "
                  f"size{said}, the output's by an order of magnitude more")
    if op.blame == SCALE:
        moved = (f"its L2 norm is {1 + cast(float, out.scale_error):.6g} times golden's "
                 f"(inputs {1 + op.scale_in:.6g})")
    else:
        moved = f"its statistics differ by {human(out.error)} of its size"
    return (f"{inputs}: {moved}; max {_stat_pair(out, 'max')}, "
            f"min {_stat_pair(out, 'min')}, mean {_stat_pair(out, 'mean')} — {verdict} (judged "
            f"from statistics only)")


def _output_message(op: "OpScore") -> str:
    return next((m.message for i, m, *_ in op.outputs if i == op.worst_out), "")


def _describe_error(op: "OpScore", rows: list[TensorRow], verdict: str = LOCAL_VERDICT,
                    inputs: str = "") -> str:
    named = inputs
    out = rows[op.worst_out] if op.worst_out is not None else None
    inp = rows[op.worst_in] if op.worst_in is not None else None
    if out is not None and out.mode == "statistics" and op.blame in (SCALE, LOCAL):
        return describe_statistics(op, out, inp, verdict, named)
    if inp is None:
        inputs = "no inputs to compare"
    else:
        inputs = (f"inputs agree ({named + ': ' if named else ''}cosine "
                  f"{human(inp.metrics.get('Cosine'))}, rel err {human(op.error_in)})")
    if op.blame == REPLAY and not op.paired:
        return (f"the golden run has no such op to compare with, but {op.replay.describe()} "
                f"— {LOCAL_VERDICT}")
    if op.blame == REPLAY and not op.outputs and op.unjudged:
        return (f"compared with golden it is {forced.NOT_JUDGED}, but {op.replay.describe()} "
                f"— {LOCAL_VERDICT}")
    if op.blame == REPLAY:
        # Found by replay alone: golden cannot tell this op's error from what it inherited.
        seen = f", output rel err {human(out.error)}" if out is not None else ""
        return (f"compared with golden its error is not distinguishable from what its inputs"
                f"{' (' + named + ')' if named else ''} carry (input rel err "
                f"{human(op.error_in)}{seen}), but {op.replay.describe()} — {LOCAL_VERDICT}")
    if op.blame == SCALE:
        out = cast(TensorRow, out)
        output = (f"output does not: it is scaled by {1 + cast(float, out.scale_error):.6g} relative to golden "
                  f"(inputs {1 + op.scale_in:.6g}; cosine {human(out.metrics.get('Cosine'))}, "
                  f"max abs err {human(out.metrics.get('MaxAbsErr'))})")
    elif op.blame == LOCAL:
        out = cast(TensorRow, out)
        output = (f"output does not (cosine {human(out.metrics.get('Cosine'))}, max abs err "
                  f"{human(out.metrics.get('MaxAbsErr'))}, rel err {human(out.error)})")
    elif op.blame == NONFINITE:
        output = f"output does not: inf/NaN appear here ({_output_message(op)})"
    elif op.blame == INTEGER:
        output = "output does not: integer output differs although the inputs are equal"
    else:
        output = "output does not"
    confirmed = f"; {op.replay.describe()}" if op.replay is not None and op.replay.culprit else ""
    return f"{inputs}, {output} — {verdict}{confirmed}"


def local_row(op: "OpScore", rows: list[TensorRow]) -> str:
    """The reason of the output row an op is blamed for (a saved tensor that could not be
    read, said by `unread_note` in the row's first reason, is still said)."""
    text = "local error: " + describe(op, rows)
    worst = op.worst_out
    if worst is not None and 0 <= worst < len(rows):
        kept = [part for part in (rows[worst].reason or "").split("; ") if part.startswith(UNREAD)]
        text = "; ".join([text, *kept])
    return text


UNREAD = "saved tensor unreadable"


def unread_note(key: str, exc: BaseException) -> str:
    """A row's note for a saved tensor that could not be loaded (a broken file, a pickle that is
    not plain tensor data): its statistics were compared instead."""
    return f"{UNREAD}: {key} ({str(exc)[:300]}); its statistics are compared instead"


def not_this_op(op: "OpScore", reason: str) -> str:
    """An output beyond its tolerance whose op is not to blame: why (inherited, or through the
    dtype limits it was given), and what replay said."""
    replayed = f"; {op.replay.describe()}" if op.replay is not None and op.replay.replayed else ""
    cause = (f"through the dtype limits it was given ({', '.join(op.const_diffs[:3])}), "
             f"as intended" if op.const_diffs and not op.arg_diffs else
             f"inherited from the inputs (input rel err {human(op.error_in)})")
    return f"{reason}; {cause}{replayed}"


def after_first(reason: str, first: str, error_in: float, independent: Optional[bool]) -> str:
    """An op blamed after the first divergence, related to it: independent (`True`: evidence
    of its own), amplified beyond its inputs (`False`: whole tensors, its inputs differ), or
    inherited (`None`: statistics cannot tell it from the first divergence's difference)."""
    if independent:
        return f"{reason}; a second error, independent of the first divergence {first}"
    if independent is not None:
        return (f"{reason}; after the first divergence {first}, its inputs already differ "
                f"(input rel err {human(error_in)}): its output differs more than they carry")
    return (f"{reason.replace('local error: ', '', 1)}; inherited from the first divergence "
            f"{first}: its inputs already differ (input rel err {human(error_in)}), and "
            f"statistics cannot tell a larger output difference from that one amplified")


def made_earlier(reason: str) -> str:
    """An input beyond its tolerance: some earlier op's output."""
    return f"{reason}; already differs when it reaches this op (made earlier)"


def outside_reason(op: "OpScore", row: TensorRow) -> str:
    """The sentence of a tensor whose values changed between two recorded ops without a
    recorded op writing them (origin "outside"), read by `op`."""
    if row.mode == "statistics":
        numbers = f"its statistics differ from golden's by {human(row.error)} of its size"
    else:
        numbers = (f"max abs err {human(row.metrics.get('MaxAbsErr'))}, cosine "
                   f"{human(row.metrics.get('Cosine'))}")
    return (f"{row.target_name} changed between two recorded ops without a recorded op writing "
            f"it: its values when {op.name} read them are not those the op that made it "
            f"recorded ({numbers}); something outside torch wrote into it (a .numpy() or DLPack "
            f"view, an extension kernel writing through data_ptr()), so {op.op} is not to blame "
            f"for what it was handed")


def source_context(location: Optional[Location], radius: int = 2,
                   source_root: Optional[str | os.PathLike[str]] = None,
                   dumps: Iterable[Optional[str | os.PathLike[str]]] = ()
                   ) -> tuple[tuple[int, str], ...]:
    """(line number, text) pairs around a location's line: read from a file under
    `source_root` (a directory the user named: `--source-root`), else the lines the dump holds
    for it (capture stores them with the call site: `dumps` are the step/rank directories the
    location came from), else (). Never from the path a dump names by itself: a dump is
    untrusted, and a frame naming `/home/me/.ssh/id_rsa` must not put its lines into a report
    (SECURITY.md). The line itself is `location.code`, shown by every report anyway."""
    if location is None or not location.file or location.line < 1:
        return ()
    if source_root is not None:
        found = _read_under(location, radius, source_root)
        if found:
            return found
    for dump in dumps:
        if dump is not None:
            found = stored_context(dump, location)
            if found:
                return found
    return ()


def _read_under(location: Location, radius: int,
                source_root: str | os.PathLike[str]) -> tuple[tuple[int, str], ...]:
    path = source_file(location.file, source_root)
    if path is None:
        return ()
    try:
        with dumpfiles.open_file(path, source_root) as f:
            text = f.read(_MAX_SOURCE_BYTES).decode("utf-8", errors="replace")
    except (OpdiffError, OSError):
        return ()
    lines = text.splitlines()
    first, last = max(1, location.line - radius), min(len(lines), location.line + radius)
    return tuple((n, lines[n - 1]) for n in range(first, last + 1))


def stored_context(dump: str | os.PathLike[str], location: Location) -> tuple[tuple[int, str], ...]:
    """The lines around `location` that an opdiff dump's stacks.jsonl holds for it (capture
    reads them in the user's process); () for other dumps or when none match."""
    from ..store.reader import find_dumps, open_dump

    try:
        stacks = [frames for path in find_dumps(dump)[:_MAX_DUMPS]
                  for frames in open_dump(path).stacks().values()]
    except (OpdiffError, OSError):
        return ()
    for frames in stacks:
        inner = frames[0] if frames else None
        if inner is None or inner.get("file") != location.file or inner.get("line") != location.line:
            continue
        context = inner.get("context")
        if isinstance(context, list) and len(context) <= 2 * _MAX_RADIUS + 1 and all(
                isinstance(c, list) and len(c) == 2 and isinstance(c[0], int)
                and isinstance(c[1], str) for c in context):
            return tuple((int(n), str(t)[:_MAX_LINE_CHARS]) for n, t in context)
    return ()


_MAX_RADIUS = 10
_MAX_DUMPS = 8      # step/rank directories searched under a dump root
_MAX_LINE_CHARS = 1000
_MAX_SOURCE_BYTES = 8 << 20


def source_file(file: str, source_root: str | os.PathLike[str]) -> Optional[str]:
    """The Python source file under `source_root` (symlinks resolved, never leaving it) that a
    dump's frame path names: the path itself when it lies under the root, else the longest tail
    of its parts found under the root (a dump from another machine: `/home/a/proj/model.py` is
    `ROOT/proj/model.py` or `ROOT/model.py`). Only a `.py` file, none of whose parts under the
    root is hidden or version-control metadata (`.git/config`, `.env`, `secrets.yaml` are never
    read: `not_source`). None when there is none."""
    root = os.path.realpath(source_root)
    if not os.path.isdir(root):
        return None
    parts = [p for p in re.split(r"[\\/]+", file) if p and p not in (".", "..")]
    candidates = [file] if os.path.isabs(file) else []
    candidates += [os.path.join(root, *parts[i:]) for i in range(len(parts))]
    for candidate in candidates:
        if dumpfiles.is_file(candidate, root):
            real = os.path.realpath(candidate)
            why = not_source(os.path.relpath(real, root))
            if why is None:
                return real
            if real not in _said:
                _said.add(real)
                log.warning("opdiff: --source-root: not showing the lines of %s: %s", real, why)
            return None
    return None


_VCS = frozenset({"CVS", "RCS", "SCCS", "_darcs"})     # version-control folders without a dot
_said: set[str] = set()


def not_source(relative: str) -> Optional[str]:
    """Why the file at `relative` (a path under --source-root) is not shown; None for a Python
    source file (`.py`, no part hidden or version-control metadata)."""
    parts = re.split(r"[\\/]+", relative)
    if not parts[-1].endswith(".py"):
        return "only .py source files are read there"
    if any(p.startswith(".") or p in _VCS for p in parts):
        return "files in hidden or version-control folders (.git, .hg, ...) are never read"
    return None


def with_code(location: Optional[Location], source_root: Optional[str | os.PathLike[str]]
              ) -> Optional[Location]:
    """A location whose dump holds no code line (some foreign dumps) with its line read under
    `source_root` (`source_context`); unchanged otherwise."""
    if location is None or location.code or source_root is None:
        return location
    line = dict(source_context(location, 0, source_root)).get(location.line)
    return dataclasses.replace(location, code=line.strip()) if line else location


def with_context(divergence: _D, source_root: Optional[str | os.PathLike[str]] = None,
                 dumps: Iterable[Optional[str | os.PathLike[str]]] = ()) -> _D:
    """A Divergence with its `context` (`source_context`: under `source_root`, else what
    `dumps` hold), and a region's source lines of both sides with their code read under
    `source_root` where the dump held none; unchanged when there is none."""
    if divergence is None:
        return divergence
    found: Any = divergence
    changes: dict[str, Any] = {}
    context = source_context(found.location, source_root=source_root, dumps=dumps)
    if context:
        changes["context"] = context
    if found.region and source_root is not None:    # a region's lines of both sides
        changes["region"] = {**found.region, **{
            side: [_code_of(loc, source_root) for loc in found.region.get(side) or ()]
            for side in ("target_locations", "golden_locations")}}
    return cast(_D, dataclasses.replace(found, **changes)) if changes else divergence


def _code_of(loc: Any, source_root: str | os.PathLike[str]) -> Any:
    """A region's source line ({"file", "line", "code"}) with its code read under
    `source_root` where the dump held none (`with_code`)."""
    if not isinstance(loc, dict) or loc.get("code") or not isinstance(loc.get("file"), str) \
            or not isinstance(loc.get("line"), int):
        return loc
    found = with_code(Location(loc["file"], loc["line"]), source_root)
    return {**loc, "code": found.code} if found is not None and found.code else loc


def statistics_limits(rows: list[TensorRow], policy: "Policy", replayed: bool = False) -> Optional[str]:
    """A note on what a compare of statistics alone cannot see, or None when whole tensors
    were compared. Statistics hide most of an input's error (random rounding noise averages out
    of a norm or a mean), so an op is blamed only for errors above the floors of
    `opdiff.comparison.verdicts` (`statistics_tolerance`); smaller ones stay unnamed."""
    from ..dtypes import canonical_dtype

    paired = [r for r in rows if r.result != UNMATCHED]
    stats = [r for r in paired if r.mode == "statistics"]
    if not stats:
        return None
    dtype = canonical_dtype(run_precision(rows)) or "float32"

    def pct(phase: str, scale: bool = False) -> str:
        return f"{100 * policy.statistics_tolerance_for(dtype, dtype, phase, scale=scale):.2g}%"

    limits = []
    if any(r.phase != Phase.BACKWARD for r in stats):
        limits.append(f"{pct(Phase.FORWARD, True)} (its norm) or {pct(Phase.FORWARD)} (its max, "
                      f"min or mean) in forward")
    if any(r.phase == Phase.BACKWARD for r in stats):
        limits.append(f"{pct(Phase.BACKWARD)} in backward")
    how = ("dump both runs with task='tensor' to compare whole tensors" if replayed else
           "dump with task='tensor' to compare whole tensors and replay ops in float64")
    which = "" if len(stats) == len(paired) else f" for {len(stats)} of {len(paired)} tensors"
    return (f"statistics only{which}: an op is named only when its output's statistics move by "
            f"more than {', '.join(limits)}, relative to the tensor's magnitude (more for "
            f"tensors of under {policy.thresholds.statistics_small_numel} elements); smaller "
            f"errors cannot be told apart from {dtype} rounding here; {how}")


# The row reason of a tensor pair whose DTensor shards are placed differently (`not_comparable`).
NOT_COMPARABLE = "not comparable: "


def _placed(p: Optional[Placement]) -> str:
    if not p:
        return "none (a plain tensor)"
    placements = ", ".join(str(x) for x in p.get("placements") or ()) or "?"
    return (f"{placements} on mesh coordinate {p.get('coordinate')} of global shape "
            f"{p.get('global_shape')}")


def not_comparable(tp: Optional[Placement], gp: Optional[Placement]) -> str:
    """The row reason of a tensor pair whose DTensor shards (capture's `placement`; None: a
    plain tensor) are placed differently: rank r of each run holds another part of the tensor."""
    return (f"{NOT_COMPARABLE}target placement {_placed(tp)}, golden {_placed(gp)}: rank r of "
            f"the two runs holds different parts of the global tensor")


def incomparable_ops(rows: list[TensorRow]) -> set[str]:
    """The record names of ops with a tensor `not_comparable` left uncompared."""
    return {r.op_name for r in rows if r.reason.startswith(NOT_COMPARABLE)}


def not_judged(reason: str) -> str:
    """An output beyond its tolerance whose op has tensors `not_comparable`: nothing to judge by."""
    return (f"{reason}; the op is not judged: some of its tensors are not comparable (the runs "
            f"were sharded differently)")


def placement_note(rows: list[TensorRow]) -> Optional[str]:
    """The pair's note when some tensors were sharded differently in the two runs, else None."""
    odd = [r for r in rows if r.reason.startswith(NOT_COMPARABLE)]
    if not odd:
        return None
    return (f"the runs were sharded differently (another device mesh or DTensor placements): "
            f"{len(odd)} tensor(s) of {len(incomparable_ops(odd))} op(s) are not comparable (first: "
            f"{odd[0].target_name}, {odd[0].reason[len(NOT_COMPARABLE):]}); those ops are not "
            f"judged, and the pair is inconclusive where it depends on them; dump both runs "
            f"with the same mesh and placements")


__all__ = ["NOT_COMPARABLE", "not_comparable", "incomparable_ops", "not_judged",
           "placement_note",
           "describe", "describe_statistics", "local_row", "unread_note", "UNREAD", "not_this_op", "made_earlier",
           "after_first",
           "outside_reason", "source_context", "source_file", "stored_context", "with_code",
           "with_context", "statistics_limits"]
