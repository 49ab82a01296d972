"""Why, in English: the sentences that say why an op is blamed, why a row is only a warning, and
what a compare of statistics alone cannot see. The rules that decide are in
`opdiff.comparison.blame`; nothing here decides anything.

    from opdiff.comparison.reasons import describe
    describe(op, rows)   # "inputs agree (cosine 1.000000, rel err 0), output does not (...) — local error in this op"

Tests assert on `Divergence.kind` and the culprit's name, not on these phrases.
"""
from __future__ import annotations

import linecache
import os
from typing import TYPE_CHECKING, Any, Optional, cast

from ..numbers import human
from ..store.schema import Location, Phase
from .result import NONFINITE, REPLAY, SCALE, LOCAL, INTEGER, UNMATCHED, TensorRow
from .verdicts import run_precision

if TYPE_CHECKING:       # (blame imports this module: no import at run time)
    from .blame import OpScore
    from .verdicts import Policy

LOCAL_VERDICT = "local error in this op"


def describe(op: "OpScore", rows: list[TensorRow]) -> str:
    """The one sentence that says why `op` is the culprit."""
    if op.arg_diffs and op.blame != REPLAY:
        return _describe_error(op, rows, (
            f"its number arguments differ ({', '.join(op.arg_diffs[:3])}): the difference enters "
            f"the computation here, through them"))
    return _describe_error(op, rows)


def _stat_pair(row: TensorRow, key: str) -> str:
    return f"{human(row.target_stats.get(key))} vs {human(row.golden_stats.get(key))}"


def describe_statistics(op: "OpScore", out: TensorRow, inp: Optional[TensorRow],
                        verdict: str) -> str:
    """The reason when only statistics were compared: no cosine or max abs err to quote."""
    if inp is None:
        inputs = "no inputs to compare, the output's statistics differ"
    elif op.error_in == 0:
        inputs = "the inputs' statistics agree exactly, the output's do not"
    elif inp.accuracy_reached != "No":     # within its tolerance
        inputs = (f"the inputs' statistics agree (worst differs by {human(op.error_in)} of its "
                  f"size), the output's do not")
    else:       # inputs that differ already, by an order of magnitude less than the output
        inputs = (f"the inputs' statistics differ by at most {human(op.error_in)} of their size, "
                  f"the output's by an order of magnitude more")
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


def _describe_error(op: "OpScore", rows: list[TensorRow], verdict: str = LOCAL_VERDICT) -> str:
    out = rows[op.worst_out] if op.worst_out is not None else None
    inp = rows[op.worst_in] if op.worst_in is not None else None
    if out is not None and out.mode == "statistics" and op.blame in (SCALE, LOCAL):
        return describe_statistics(op, out, inp, verdict)
    if inp is None:
        inputs = "no inputs to compare"
    else:
        inputs = (f"inputs agree (cosine {human(inp.metrics.get('Cosine'))}, "
                  f"rel err {human(op.error_in)})")
    if op.blame == REPLAY and not op.paired:
        return (f"the golden run has no such op to compare with, but {op.replay.describe()} "
                f"— {LOCAL_VERDICT}")
    if op.blame == REPLAY:
        # Found by replay alone: golden cannot tell this op's error from what it inherited.
        seen = f", output rel err {human(out.error)}" if out is not None else ""
        return (f"compared with golden its error is not distinguishable from what its inputs "
                f"carry (input rel err {human(op.error_in)}{seen}), but {op.replay.describe()} "
                f"— {LOCAL_VERDICT}")
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
    """The reason of the output row an op is blamed for."""
    return "local error: " + describe(op, rows)


def not_this_op(op: "OpScore", reason: str) -> str:
    """An output beyond its tolerance whose op is not to blame: why (inherited, or through the
    dtype limits it was given), and what replay said."""
    replayed = f"; {op.replay.describe()}" if op.replay is not None and op.replay.replayed else ""
    cause = (f"through the dtype limits it was given ({', '.join(op.const_diffs[:3])}), "
             f"as intended" if op.const_diffs and not op.arg_diffs else
             f"inherited from the inputs (input rel err {human(op.error_in)})")
    return f"{reason}; {cause}{replayed}"


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


def source_context(location: Optional[Location], radius: int = 2) -> tuple[tuple[int, str], ...]:
    """(line number, text) pairs around a location, when the file is readable."""
    if location is None or not location.file or not os.path.isfile(location.file):
        return ()
    lines = []
    for n in range(max(1, location.line - radius), location.line + radius + 1):
        text = linecache.getline(location.file, n)
        if text:
            lines.append((n, text.rstrip("\n")))
    return tuple(lines)


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


def _placed(p: Optional[dict[str, Any]]) -> str:
    if not p:
        return "none (a plain tensor)"
    placements = ", ".join(str(x) for x in p.get("placements") or ()) or "?"
    return (f"{placements} on mesh coordinate {p.get('coordinate')} of global shape "
            f"{p.get('global_shape')}")


def not_comparable(tp: Optional[dict[str, Any]], gp: Optional[dict[str, Any]]) -> str:
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
           "describe", "describe_statistics", "local_row", "not_this_op", "made_earlier",
           "outside_reason", "source_context", "statistics_limits"]
