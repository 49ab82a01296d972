"""Where a difference comes from: the origin of a divergence, decided by one ordered set of rules.

Every origin is one `Origin` constant (opdiff.comparison.result: `Divergence` carries it) and
one `Rule` of `RULES` below, in the same order. On one pair, `divergence` walks the pair rules
in order on the earliest op still blamed and the first that holds makes the Divergence; the
cross-pair rules then re-label pairs' divergences from the other pairs, each through one
function (`Rule.across`). Adding an origin: its `Origin` constant, its `Rule` here (and, for a
cross-pair one, where its function is called), and the schema's enum (schemas/compare-summary).

    origin       rule (tried in this order)                   what differs
    one pair:
    "parameter"  a leaf record, leaf "parameter" (or other)    a parameter, before any op read it
    "buffer"     a leaf record, leaf "buffer"                 a buffer (running statistic, mask...)
    "input"      a leaf record, leaf "input"                  a root-call input
    "outside"    `judge_outside` blamed the op                a tensor that changed between two
                                                              recorded ops without a recorded op
                                                              writing it (capture marks the
                                                              reader's input, opdiff.capture.handles)
    "region"     an OpScore of kind region                    ops the runs do not share, judged
                                                              as one (opdiff.comparison.regions)
    "random"     `random_reason`: generators in other states  a random op's draws
    "number"     the op's number arguments differ             a Python number argument
    "op"         always (the last pair rule)                  the op's own computation
    across pairs:
    "collective" `ranks.attribute_collectives` (api.compare)   received through a collective from
                                                              another rank (recorded or inferred)
    "optimizer"  `across_steps` (runs.merge)                  parameters at the start of step S,
                                                              although step S-1 agreed throughout

`across_steps` also re-labels a step's divergence when an earlier step diverged already
(`carried_over`: origin "parameter", its reason saying from which step).

Capture records each parameter, buffer and root-call input once per step, before the first op
that reads it (`Kind.LEAF` records, see `opdiff.capture.leaves`). Two runs that start from the
same weights and data hold them bit for bit alike (or, in two dtypes, within the dtype's
rounding), so a leaf that differs is the origin, whatever the ops after it do. For a leaf, the
divergence's `name`, `op`, `phase` and `location` are those of the first op that reads it and
`tensor` its FQN; for "outside", `tensor` is the input read and name/op/location the reader.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, cast

from ..numbers import human
from ..store.schema import Kind, RecordName
from . import ranks, reasons
from .region_verdict import region_divergence
from .regions import REGION
from .result import (ERROR, INTEGER, LEAF_KIND, NONFINITE, NUMBER, RANDOM, REPLAY, WARNING, Divergence, Origin,
                     TensorRow)
from .verdicts import Policy

if TYPE_CHECKING:       # (blame imports this module)
    from .blame import OpScore

# A leaf's statistics, compared in one dtype, move by more than this (relative to its
# magnitude) only when its values differ: the same tensor gives the same statistics.
STATISTICS_LEAF_TOLERANCE = 1e-6
# A scope's input (capture.leaves.scope_input_fqn: `blocks.1.input0`; a root call's is its slot)
SCOPE_INPUT = re.compile(r".+\.input\d+$")
# From this share of differing parameters on, the runs start from different weights.
MOST_PARAMETERS = 0.5


def judge_leaf(op: "OpScore", policy: Policy, run_dtype: Optional[str] = None,
               floors: Optional[Mapping[int, Any]] = None) -> None:
    """A leaf differs when its values do: at step 0, exactly in one dtype (saved tensors),
    beyond the statistics' own rounding (statistics), or beyond the tolerance of two dtypes;
    at later steps (weights trained in two precisions drift apart) beyond the tolerances an
    op's output is held to."""
    best: Optional[tuple[float, int]] = None
    for row_index, m, tdt, gdt in op.outputs:
        floor = (floors or {}).get(row_index)     # measured (`opdiff calibrate`)
        if m.nonfinite_mismatch:
            differs = True
        elif floor is not None:
            differs = m.error > policy.measured_tolerances(floor, tdt, gdt)[0]
        elif not op.leaf_strict or (tdt != gdt and m.mode == "statistics"):
            # (after step 0 the weights carry the earlier steps' healthy rounding differences)
            run = run_dtype or gdt
            tol = policy.run_tolerance_for(tdt, gdt, run)
            if m.mode == "statistics":
                tol = max(tol, policy.statistics_tolerance_for(tdt, gdt, op.phase, m.numel),
                          policy.statistics_tolerance_for(run, run, op.phase, m.numel))
            differs = m.error > tol
        elif tdt != gdt:
            differs = m.error > policy.tolerance_for(tdt, gdt)
        elif m.mode == "statistics":
            differs = m.error > STATISTICS_LEAF_TOLERANCE
        else:
            differs = m.error > 0 or bool(m.metrics.get("MaxAbsErr"))
        if differs and (best is None or m.error > best[0]):
            best = (m.error, row_index)
    if best is not None:
        op.local, op.worst_out, op.blame = True, best[1], LEAF_KIND


def _beyond_tolerance(op: "OpScore", m: Any, tdt: Optional[str], gdt: Optional[str],
                      policy: Policy, run_dtype: Optional[str]) -> bool:
    """A tensor differs beyond what the two dtypes (and statistics' own rounding) allow."""
    if m.nonfinite_mismatch:
        return True
    run = run_dtype or gdt
    tol = policy.run_tolerance_for(tdt, gdt, run)
    if m.mode == "statistics":
        tol = max(tol, policy.statistics_tolerance_for(tdt, gdt, op.phase, m.numel),
                  policy.statistics_tolerance_for(run, run, op.phase, m.numel))
    return bool(m.error > tol)


def judge_outside(op_scores: Sequence["OpScore"], rows: list[TensorRow], policy: Policy,
                  run_dtype: Optional[str] = None) -> None:
    """An op whose input was changed outside torch after a recorded op described it (capture
    marks that input `"leaf": "outside"`) and differs from golden's is not to blame for it: the
    difference enters there (origin "outside"), whatever the op computes from it."""
    for op in op_scores:
        marked = {i for i, what in op.leaf_inputs.items()
                  if what.startswith(Origin.OUTSIDE + " ")}
        if not marked:
            continue
        best: Optional[tuple[float, int]] = None
        for row_index, m, tdt, gdt in op.inputs:
            if row_index in marked and _beyond_tolerance(op, m, tdt, gdt, policy, run_dtype):
                if best is None or m.error > best[0]:
                    best = (m.error, row_index)
        if best is not None:
            op.local, op.blame, op.worst_in, op.worst_out = True, Origin.OUTSIDE, best[1], None
            for row_index, _, _, _ in op.outputs:    # what it computed from them: inherited
                row = rows[row_index]
                if row.result == ERROR:
                    rows[row_index] = replace(row, result=WARNING, reason=(
                        f"{row.reason}; inherited from an input changed outside torch"))


def outside_divergence(op: "OpScore", rows: list[TensorRow], op_scores: Sequence["OpScore"] = (),
                       origin: str = Origin.OUTSIDE) -> Divergence:
    """The first divergence when a tensor changed outside torch (see judge_outside): named
    after the op that reads it, the tensor being the input it read."""
    row = rows[cast(int, op.worst_in)]
    return Divergence(
        name=op.name, op=op.op, phase=op.phase, reason=reasons.outside_reason(op, row),
        location=op.location, metrics=dict(row.metrics), tensor=row.target_name,
        input_metrics=dict(row.metrics), module=op.module,
        context=reasons.source_context(op.location), kind=LEAF_KIND, origin=origin)


def relate_to_first(op_scores: Sequence["OpScore"], rows: list[TensorRow]) -> None:
    """The rows of ops blamed after the first divergence say how they relate to it: a second
    error of its own where the evidence is independent of it (its inputs agree exactly, replay
    on its own inputs, inf/NaN from finite inputs, random draws, number arguments); else its
    inputs already differ, and an output that differs only more is what statistics cannot tell
    from the first divergence's difference amplified: inherited (a warning)."""
    blamed = sorted((op for op in op_scores if op.local), key=lambda o: o.seq)
    first = (blamed[0].reader or blamed[0].name) if blamed else ""   # (the Divergence's name)
    for op in blamed[1:]:
        if op.kind in (REGION, Kind.LEAF) or op.worst_out is None:
            continue
        independent = (op.error_in == 0.0 or op.blame in (REPLAY, NONFINITE, INTEGER)
                       or op.divergence_kind == NUMBER or random_reason(op) is not None
                       or (op.replay is not None and op.replay.culprit))
        statistics = rows[op.worst_out].mode == "statistics"
        for i, _, _, _ in op.outputs:
            row = rows[i]
            if row.result != ERROR:
                continue
            if independent or not statistics:
                rows[i] = replace(row, reason=reasons.after_first(
                    row.reason, first, op.error_in, independent))
            else:
                rows[i] = replace(row, result=WARNING, reason=reasons.after_first(
                    row.reason, first, op.error_in, None))


def _what(op: "OpScore") -> str:
    return op.leaf or Origin.PARAMETER


def leaf_reason(op: "OpScore", rows: list[TensorRow], op_scores: Sequence["OpScore"]) -> str:
    """The sentence of a differing leaf (or of most parameters differing)."""
    what = _what(op)
    if what == Origin.PARAMETER:
        params = [o for o in op_scores if o.kind == Kind.LEAF and _what(o) == Origin.PARAMETER]
        differ = [o for o in params if o.local]
        if len(differ) > 1 and len(differ) >= MOST_PARAMETERS * len(params):
            return (f"{len(differ)} of {len(params)} parameters differ before any op: the runs "
                    f"start from different weights; check the seed or the checkpoint (first: "
                    f"{op.fqn}, {_numbers(op, rows)})")
    why = {Origin.PARAMETER: "the runs do not start from the same weights",
           Origin.BUFFER: "the runs do not start from the same model state (a running statistic, a "
                   "mask or a table the model keeps)",
           Origin.INPUT: "the runs are not given the same data"}.get(what, "")
    if what == Origin.INPUT and SCOPE_INPUT.match(op.fqn or ""):
        why = ("the dumped scope starts from different values, made before it opened: dump "
               "without the scope (or with one that opens earlier) to find where")
    return f"{what} {op.fqn} differs before any op uses it ({_numbers(op, rows)}): {why}"


def _numbers(op: "OpScore", rows: list[TensorRow]) -> str:
    if op.worst_out is None:
        return "values differ"
    row = rows[op.worst_out]
    m = row.metrics
    if row.mode == "statistics":
        return f"its statistics differ by {human(row.error)} of its size"
    return f"max abs err {human(m.get('MaxAbsErr'))}, cosine {human(m.get('Cosine'))}"


def leaf_divergence(op: "OpScore", rows: list[TensorRow], op_scores: Sequence["OpScore"],
                    origin: str = Origin.PARAMETER) -> Divergence:
    """The first divergence when it is a leaf: named after the first op that reads it."""
    reader = op.reader or op.name
    parsed = RecordName.parse(reader)
    out = rows[op.worst_out] if op.worst_out is not None else None
    return Divergence(
        name=reader, op=parsed.op if parsed is not None else reader,
        phase=parsed.phase if parsed is not None else op.phase,
        reason=leaf_reason(op, rows, op_scores), location=op.location,
        metrics=dict(out.metrics) if out is not None else {}, tensor=op.fqn, module=op.module,
        context=reasons.source_context(op.location), kind=LEAF_KIND, origin=origin)


def leaf_input_reason(reason: str, leaf: str) -> str:
    """An op's input that differs because it is a differing leaf (not 'made earlier'), or
    because it changed outside torch after it was recorded (`leaf` "outside <name>")."""
    if leaf.startswith(Origin.OUTSIDE + " "):
        return f"{reason}; changed outside torch after the op that made it was recorded (the origin)"
    return f"{reason}; {leaf}: differs before any op (its own row is the origin)"


def random_reason(op: "OpScore") -> Optional[str]:
    """The sentence of a random op whose generators were in different states, else None."""
    if len(op.rng) != 2 or op.rng[0] == op.rng[1] or not all(op.rng):
        return None
    t, g = op.rng
    if t is None or g is None:      # (`all` above: never; says so to the type checker)
        return None
    t_dev, g_dev = t.split(":", 1)[0], g.split(":", 1)[0]
    if t_dev != g_dev:
        return (f"{op.op} draws random numbers on {t_dev} in the target and {g_dev} in golden: "
                f"generators of two device types cannot agree by design, so its draws differ; "
                f"compare with the randomness switched off (model.eval(), dropout 0) or draw the "
                f"numbers on one device and pass them to both runs")
    return (f"{op.op} draws from a random generator in another state than golden's (fingerprints "
            f"{t} vs {g}): its random numbers differ, not its arithmetic; seed both runs alike "
            f"right before the recorded region, e.g. opdiff.seed_all(1234), or switch the "
            f"randomness off (model.eval())")


def optimizer_origin(previous: Optional[Divergence], previous_compared: bool,
                     current: Optional[Divergence]) -> Optional[Divergence]:
    """Step S's divergence seen across steps: parameters that differ at the start of step S
    while step S-1 was compared and agreed throughout (its gradients included) were changed
    by what ran between the two recorded regions: the optimizer's update (a learning rate, a
    weight decay, a fused kernel). Returns `current` re-labelled, or unchanged."""
    if (current is None or current.origin != Origin.PARAMETER or previous is not None
            or not previous_compared):
        return current
    return replace(current, origin=Origin.OPTIMIZER, reason=(
        f"{current.reason.split(':')[0]}, although everything of step {_previous(current)} "
        f"agreed, its gradients included: the optimizer's update differs between the runs (its "
        f"learning rate, weight decay or kernel); the parameter was changed outside the "
        f"recorded region"))


def across_steps(results: Sequence[Any]) -> None:
    """Origins seen across steps, on the per-pair results before they are merged (see
    comparison/runs.py): `optimizer_origin` where step S-1 (same rank) was compared and agreed,
    `carried_over` where an earlier step of any rank diverged already (data-parallel ranks
    share their weights), citing the earliest such step where the difference started."""
    by_key = {(r.step, r.rank): r for r in results if r.step is not None}
    for r in results:
        if r.step is None or r.first_divergence is None:
            continue
        before = by_key.get((r.step - 1, r.rank))
        if before is not None:
            r.first_divergence = optimizer_origin(before.first_divergence, True,
                                                  r.first_divergence)
        earlier = [e for e in results if e.step is not None and e.step < r.step
                   and e.first_divergence is not None]
        if earlier:
            # the earliest step; there, where the difference started (not a rank that
            # received it through a collective), this rank's own first
            first = min(earlier, key=lambda e: (
                e.step, ranks.received_from(e.first_divergence),
                e.rank != r.rank, e.rank if e.rank is not None else -1))
            r.first_divergence = carried_over(first.first_divergence, r.first_divergence,
                                              r.rows)


# The words that say a divergence was carried over from an earlier step (`carried_over`; files of
# an older opdiff are recognised by them once, where they are read: report/summary.py).
CARRIED = "carried over from step"


def carried_over(earlier: Divergence, current: Divergence, rows: Sequence[TensorRow]) -> Divergence:
    """Step S's divergence when an earlier step S0 of the run diverged already: the parameters
    of step S were trained from that difference. A differing parameter (origin "parameter")
    says so instead of "the runs do not start from the same weights"; an op named while the
    parameters it starts from already differ (weights drift below the tolerance the leaf is
    held to, then an op's output crosses its own) is not a local error: origin "parameter",
    the worst differing parameter its tensor. Anything else (a random op, a number argument,
    a parameter-free step) is returned unchanged."""
    if is_carried_over(current):
        return current
    since = (f"{CARRIED} {earlier.step}, which diverged at {earlier.name}"
             f"{'' if earlier.rank is None else f' (rank {earlier.rank})'}: the training steps "
             f"since then carried that difference into the weights")
    if current.origin == Origin.PARAMETER:
        head = current.reason.split(":")[0].replace(" before any op uses it", "").replace(
            " before any op", "")
        return replace(current, reason=f"{head} at the start of step {current.step}, {since}",
                       carried_from=earlier.step)
    if current.origin != Origin.OP:
        return current
    differ = _differing_parameters(rows)
    if not differ:
        return current
    worst = max(differ, key=lambda row: row.error or 0.0)
    return replace(current, origin=Origin.PARAMETER, kind=LEAF_KIND, tensor=worst.leaf_tensor,
                   carried_from=earlier.step, reason=(
        f"{current.name} differs, but {len(differ)} parameter(s) already differ at the start "
        f"of step {current.step} (worst: {worst.leaf_tensor}, {_row_numbers(worst)}), "
        f"{since}; not a local error in this op"))


def is_carried_over(fd: Optional[Divergence]) -> bool:
    """Whether a divergence was carried over from an earlier step (`carried_over`)."""
    return fd is not None and fd.origin == Origin.PARAMETER and fd.carried_from is not None


def _differing_parameters(rows: Sequence[TensorRow]) -> list[TensorRow]:
    """The parameter leaf rows of a pair that differ at all (statistics beyond their own
    rounding; whole tensors in any element)."""
    out = []
    for row in rows:
        if row.leaf != Origin.PARAMETER or row.error is None:
            continue
        tol = STATISTICS_LEAF_TOLERANCE if row.mode == "statistics" else 0.0
        if row.error > tol or row.metrics.get("MaxAbsErr"):
            out.append(row)
    return out


def _row_numbers(row: TensorRow) -> str:
    if row.mode == "statistics":
        return f"its statistics differ by {human(row.error)} of its size"
    return f"max abs err {human(row.metrics.get('MaxAbsErr'))}"


def _previous(current: Divergence) -> str:
    return str(current.step - 1) if current.step is not None else "S-1"


def op_divergence(op: "OpScore", rows: list[TensorRow], op_scores: Sequence["OpScore"] = (),
                  origin: str = Origin.OP) -> Divergence:
    """The first divergence when it is an op's call: its own error (origin "op"), its number
    arguments ("number") or its random draws ("random"); the reason in words is
    `reasons.describe`'s, or `random_reason`'s."""
    random = random_reason(op)
    out = rows[op.worst_out] if op.worst_out is not None else None
    inp = rows[op.worst_in] if op.worst_in is not None else None
    tensor = out.target_name if out is not None else (
        op.replay.worst.name if op.replay is not None and op.replay.worst else None)
    return Divergence(
        name=op.name, op=op.op, phase=op.phase,
        reason=reasons.describe(op, rows) if random is None else random,
        location=op.location, metrics=dict(out.metrics) if out is not None else {},
        tensor=tensor, input_metrics=dict(inp.metrics) if inp is not None else {},
        module=op.module, context=reasons.source_context(op.location),
        kind=op.divergence_kind if random is None else RANDOM, origin=origin)


# The heading of an op's (or a region's) own error where the evidence says its inputs agree.
AGREE = "Inputs agree, outputs do not"
Holds = Callable[["OpScore"], bool]
# (the earliest op still blamed, the pair's rows, all its OpScores, the rule's origin)
Make = Callable[["OpScore", list[TensorRow], Sequence["OpScore"], str], Divergence]


@dataclass(frozen=True)
class Rule:
    """How one origin is decided, and what report.html's verdict box heads it with.

    A pair rule has `holds(op)`, asked of the earliest op still blamed, and `make(op, rows,
    op_scores, origin)`, its Divergence. A cross-pair rule has `across` instead: the one
    function that re-labels pairs' divergences from the other pairs (its docstring says who
    calls it)."""
    origin: str
    heading: str
    holds: Optional[Holds] = None
    make: Optional[Make] = None
    across: Optional[Callable[..., Any]] = None


def _leaf(what: str) -> Holds:
    return lambda op: op.kind == Kind.LEAF and _what(op) == what


def _leaf_other() -> Holds:     # (a leaf named neither buffer nor input: a parameter)
    return lambda op: op.kind == Kind.LEAF and _what(op) not in (Origin.BUFFER, Origin.INPUT)


def _region(op: "OpScore", rows: list[TensorRow], _scores: Sequence["OpScore"],
            _origin: str) -> Divergence:
    return region_divergence(op, rows)


# Every origin's rule, in the order they are tried (that of `Origin.ALL`).
RULES = (
    Rule(Origin.PARAMETER, "A parameter differs before any op reads it", _leaf_other(),
         leaf_divergence),
    Rule(Origin.BUFFER, "A buffer differs before any op reads it", _leaf(Origin.BUFFER),
         leaf_divergence),
    Rule(Origin.INPUT, "An input differs before any op reads it", _leaf(Origin.INPUT),
         leaf_divergence),
    Rule(Origin.OUTSIDE, "Changed outside torch", lambda op: op.blame == Origin.OUTSIDE,
         outside_divergence),
    Rule(Origin.REGION, AGREE, lambda op: op.kind == REGION, _region),
    Rule(Origin.RANDOM, "Random draws differ", lambda op: random_reason(op) is not None,
         op_divergence),
    Rule(Origin.NUMBER, "Its number arguments differ", lambda op: op.divergence_kind == NUMBER,
         op_divergence),
    Rule(Origin.OP, AGREE, lambda op: True, op_divergence),
    Rule(Origin.COLLECTIVE, "Received through a collective", across=ranks.attribute_collectives),
    Rule(Origin.OPTIMIZER, "The optimizer's update differs", across=across_steps),
)
# The heading of parameters carried over from an earlier diverging step (`carried_over`).
CARRIED_HEADING = "Parameters carried over from an earlier step"


def pair_rules() -> tuple[Rule, ...]:
    """The rules decided on one pair, in order (the last, "op", always holds)."""
    return tuple(r for r in RULES if r.holds is not None)


def divergence(first: "OpScore", rows: list[TensorRow],
               op_scores: Sequence["OpScore"]) -> Divergence:
    """The Divergence of the earliest op still blamed (`blame.first_divergence`): made by the
    first pair rule that holds for it, with that rule's origin."""
    for rule in pair_rules():
        if cast(Holds, rule.holds)(first):
            return cast(Make, rule.make)(first, rows, op_scores, rule.origin)
    raise AssertionError("the last pair rule always holds")


def heading(fd: Any) -> str:
    """What report.html's verdict box heads a first divergence with, by its origin (an
    unknown origin: the op's)."""
    if is_carried_over(fd):
        return CARRIED_HEADING
    origin = getattr(fd, "origin", None)
    by_origin = {r.origin: r.heading for r in RULES}
    said = by_origin.get(origin or Origin.OP, by_origin[Origin.OP])
    if said != AGREE:
        return said
    if getattr(fd, "kind", None) == REPLAY:      # (its error was told apart by replay)
        return "Re-run on its own inputs, its output is off"
    if _statistics_differ(getattr(fd, "input_metrics", None) or {}):
        return "Its output differs more than its inputs do"
    return said


# A statistics comparison's differences (comparison/metrics.py's `stats_measure`)
_STAT_DIFFS = ("Max diff", "Min diff", "Mean diff", "L2norm diff")


def _statistics_differ(metrics: dict[str, Any]) -> bool:
    """Whether statistics' metrics show a difference (whole tensors' are judged relative to the
    output's error: "agree" is blame's word for them; statistics cannot establish it)."""
    return "Cosine" not in metrics and any(
        isinstance(metrics.get(k), (int, float)) and metrics[k] != 0 for k in _STAT_DIFFS)


__all__ = ["relate_to_first", "Origin", "Rule", "RULES", "pair_rules", "divergence", "heading", "op_divergence",
           "CARRIED_HEADING", "judge_leaf", "judge_outside", "outside_divergence",
           "leaf_reason", "leaf_divergence", "leaf_input_reason",
           "optimizer_origin", "across_steps", "carried_over", "is_carried_over", "CARRIED",
           "random_reason", "STATISTICS_LEAF_TOLERANCE", "MOST_PARAMETERS"]
