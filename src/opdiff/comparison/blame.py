"""Which op is to blame: local error versus error carried in from the inputs.

The first divergence is, in execution order, the first op whose inputs agree with golden but
whose outputs do not. "Agree" is judged relative to the error the output shows (rules and numbers
in `opdiff.comparison.verdicts`): an op whose output error is an order of magnitude above what its
inputs carry, and beyond what its dtype can explain, made that error itself (local error); an op
whose output error is of the order of its input error only inherits it (accumulated error).

- Inputs are the record's inputs and, for module calls, its parameters. For a backward record
  (inputs: grads w.r.t. the forward outputs) the forward call's tensors count as inputs too,
  since the backward formula reads them.
- In-place ops are judged on their inputs as they were before the op ran (capture records them so).
- Module records contain the API ops run inside them: a module whose output diverges because an
  op inside it did is not named; the op is. A module is named only when no op inside it shows
  the error. Likewise a module's parameter gradients (`parameters_grad`), which the backward of
  the ops inside it computed, are named only when none of those backward records shows it.
- Integer and bool outputs (argmax, masks) are blamed only when the inputs agree exactly, since
  any input noise may legitimately flip them. Ops returning uninitialised memory
  (`opdiff.ops.traits(op).uninitialized`) are never blamed.
- Python number arguments (`x[0] = 2.0`, `x * scale`) are inputs too: an op named whose number
  arguments differ between the runs is said to take the difference in through them, and replay
  (which re-runs it on the target's own arguments) does not clear it. Dtype limits are the
  exception: `masked_fill(mask, torch.finfo(dtype).min)` writes -65504 in fp16 and -3.4e38 in
  fp32 on purpose, and an op whose arguments differ only so is not named for its output.

When the target dump holds its tensors, replay (`opdiff.comparison.replay`) is a second,
independent opinion: the op re-run in float64 on the target's own inputs gives its own error,
free of anything inherited, and a CPU kernel of the target's dtype on the same inputs says how
much of that error the dtype explains. Replay confirms the comparison's culprit, clears it (its
own error is the dtype's: the difference was inherited after all), or names an op the comparison
cannot see: in backward, accumulated bf16 error (10% and more behind BatchNorm) hides a kernel
that is off by 1%. See `second_opinion` for which ops get replayed.

With statistics alone (task="statistics": max, min, mean, norm, and no replay), every error
measured is a lower bound, the inputs' most of all: rounding noise averages out of their norms
and means, so "the inputs agree" cannot be established. An op is then blamed only for an error
above the statistics floors of `opdiff.comparison.verdicts` (what a healthy bf16 run showed, with
margin), and `opdiff.comparison.reasons.statistics_limits` says what that leaves unseen.

Besides picking the culprit, the analysis rewrites each row's verdict: an output beyond its
tolerance is an `error` only when its op made the error, and a `warning` ("inherited from the
inputs") otherwise; an input beyond its tolerance is a `warning` (it is some earlier op's output).
Every rule sets a kind (`opdiff.comparison.result.DIVERGENCE_KINDS`); the sentences are
`opdiff.comparison.reasons`'.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Optional, cast

from .. import ops
from ..dtypes import LARGEST_FINITE, canonical_dtype, is_float
from ..store.records import input_numbers
from ..store.schema import Kind, Location, Phase, Record, param_grad_links
from . import noise, origins, reasons
from .result import (ERROR, INTEGER, LOCAL, NONFINITE, NUMBER, REPLAY, SCALE, WARNING,
                     Divergence, TensorRow)
from .regions import REGION, RegionUnit, computes_another_function, made_tensor, region_members
from .verdicts import run_precision

if TYPE_CHECKING:
    from .metric_table import Measurement
    from .noise_floor import MeasuredFloor
    from .replay import Replayer
    from .replay.local import LocalError, TensorLocalError
    from .verdicts import Policy


@dataclass
class OpScore:
    """One paired op call and the rows of its tensors (indices into the row list)."""
    name: str
    op: str
    phase: str
    kind: str                   # the record's Kind
    module: Optional[str]
    forward: Optional[str]
    seq: int
    location: Optional[Location]
    # [(row index, Measurement, t dtype, g dtype)]
    inputs: list[tuple[int, "Measurement", Optional[str], Optional[str]]] = field(default_factory=list)
    outputs: list[tuple[int, "Measurement", Optional[str], Optional[str]]] = field(default_factory=list)
    local: bool = False
    blame: str = ""             # why it is local: LOCAL, SCALE, NONFINITE, INTEGER or REPLAY
    worst_out: Optional[int] = None
    worst_in: Optional[int] = None
    error_in: float = 0.0
    scale_in: float = 0.0
    replay: Any = None          # opdiff.comparison.replay.LocalError once the op was replayed
    paired: bool = True         # False: only the target has this op (judged by replay alone)
    arg_diffs: list[str] = field(default_factory=list)   # number arguments that differ, as text
    const_diffs: list[str] = field(default_factory=list)  # ... that are dtype limits (finfo.min)
    leaf: Optional[str] = None  # Kind.LEAF: "parameter" | "buffer" | "input"
    fqn: Optional[str] = None   # ... its FQN (or an input's slot)
    reader: Optional[str] = None    # ... the record of the first op that reads it
    leaf_inputs: dict[int, str] = field(default_factory=dict)  # input row index -> "parameter <fqn>"
    leaf_strict: bool = True    # ... judged exactly (step 0: nothing trained them yet)
    rng: tuple[Optional[str], ...] = ()   # random ops: (target's, golden's) generator fingerprints
    region: Optional[RegionUnit] = None     # kind "region": its region, ops and what it made
    unjudged: bool = False      # a forced pair whose outputs are not judged (forced.py)

    @property
    def divergence_kind(self) -> str:
        """The kind a Divergence of this op carries (number arguments that differ take
        precedence: the difference enters there, unless replay found the op's own error)."""
        return NUMBER if self.arg_diffs and self.blame != REPLAY else self.blame


def differing_numbers(t_rec: Record, g_rec: Record) -> tuple[list[str], list[str]]:
    """The Python number arguments of a paired call that differ (`x[0] = 2.0` against
    `x[0] = 1.0`), as "input.2: 2 vs 1": (those that differ, those that are dtype limits).

    Floats within 1e-6 of their size are equal (a value read from a float32 tensor differs by
    its rounding); ints and bools must be equal. Dtype limits differ on purpose: a run in fp16
    passes `torch.finfo(torch.float16).min` where the fp32 run passes float32's (the usual
    attention mask), with the same effect, but an output that holds them differs by 1e38.
    """
    golden = input_numbers(g_rec)
    differ: list[str]
    limits: list[str]
    differ, limits = [], []
    for path, t in input_numbers(t_rec).items():
        g = golden.get(path, t)
        if isinstance(t, str) or isinstance(g, str) or t == g:   # (str: an unknown encoding)
            continue
        kind = differ
        if isinstance(t, float) or isinstance(g, float):
            if math.isnan(t) and math.isnan(g):
                continue
            if math.isfinite(t) and math.isfinite(g) and abs(t - g) <= 1e-6 * max(abs(t), abs(g)):
                continue
            if t in _dtype_limits() and g in _dtype_limits():
                kind = limits
        shown = [f"{v:.8g}" if isinstance(v, float) else str(v) for v in (t, g)]
        kind.append(f"{path}: {shown[0]} vs {shown[1]}")
    return differ, limits


@functools.lru_cache(maxsize=None)
def _dtype_limits() -> frozenset[float]:
    """The largest values of the float dtypes, both signs: what code writes where it means
    -inf or +inf. (Epsilons are left out: `var + finfo(dtype).eps` with fp16's 1e-3 against
    fp32's 1e-7 can be the very difference the user is looking for.)"""
    values: set[float] = set()
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        values.update((LARGEST_FINITE[dtype], -LARGEST_FINITE[dtype]))
    return frozenset(values)


def linked(op: OpScore) -> list[str]:
    """Records whose tensors the op's computation also read (see module docstring): a
    parameter gradient's module calls, a backward record's forward call."""
    if op.kind == Kind.PARAM_GRAD:
        return param_grad_links(op.name)
    if op.phase == Phase.BACKWARD and op.forward:
        return [op.forward]
    return []


def _input_error(op: OpScore, by_name: dict[str, OpScore]) -> tuple[float, float, Optional[int]]:
    entries = list(op.inputs)
    for name in linked(op):
        if name in by_name:
            other = by_name[name]
            entries += other.inputs + (other.outputs if other.phase == Phase.FORWARD else [])
    worst: Optional[int]
    err, scale, worst = 0.0, 0.0, None
    for row_index, m, _, _ in entries:
        e = math.inf if m.nonfinite_mismatch else m.error
        if e > err or worst is None:
            err, worst = max(err, e), row_index
        if not m.nonfinite_mismatch:
            scale = max(scale, abs(m.scale_error))
    return err, scale, worst


def _noise_fraction(policy: Policy, numel: int) -> float:
    """How much of the input's random error may show up as a scale error of the output: little
    for big tensors (it averages out), all of it for a handful of elements."""
    return min(1.0, max(policy.thresholds.scale_noise_fraction, 4.0 / math.sqrt(max(numel, 1))))


def _statistics_floor(policy: Policy, tdt: Optional[str], gdt: Optional[str],
                      run_dtype: Optional[str], phase: str, numel: int,
                      scale: bool = False) -> float:
    """The least error statistics alone may blame an op for (see `opdiff.comparison.verdicts`)."""
    return max(policy.statistics_tolerance_for(tdt, gdt, phase, numel, scale=scale),
               policy.statistics_tolerance_for(run_dtype, run_dtype, phase, numel, scale=scale))


def _candidate(op: OpScore, m: Measurement, tdt: Optional[str], gdt: Optional[str], e_in: float,
               s_in: float, policy: Policy, run_dtype: Optional[str],
               floor: Optional[MeasuredFloor] = None) -> Optional[tuple[float, str]]:
    """(size, kind) when this output shows an error the op made itself, else None."""
    if m.nonfinite_mismatch:
        return (math.inf, NONFINITE) if math.isfinite(e_in) else None
    if not (is_float(tdt) or is_float(gdt)):
        return (m.error, INTEGER) if e_in == 0.0 and m.error > 0 else None
    tol = policy.run_tolerance_for(tdt, gdt, run_dtype)
    stol = max(policy.scale_tolerance_for(tdt, gdt),
               policy.scale_tolerance_for(run_dtype, run_dtype))
    if m.mode == "statistics":
        tol = max(tol, _statistics_floor(policy, tdt, gdt, run_dtype, op.phase, m.numel))
        stol = max(stol, _statistics_floor(policy, tdt, gdt, run_dtype, op.phase, m.numel,
                                           scale=True))
    if floor is not None:       # measured (`opdiff calibrate`): max(dtype floor, k x floor)
        tol, stol = policy.measured_tolerances(floor, tdt, gdt)
    if op.phase == Phase.BACKWARD and policy.within_input_noise(
            m, [i[1] for i in op.inputs], tol, same_rounding=canonical_dtype(tdt) == canonical_dtype(gdt),
            dtype=tdt):
        return None     # noise around a true zero (verdicts.Policy.within_input_noise)
    s = abs(m.scale_error)
    if m.error > tol and m.error > policy.amplification * e_in:
        return m.error, LOCAL
    if (m.numel >= policy.thresholds.scale_min_numel
            and s > stol + policy.thresholds.scale_amplification * s_in
            and s > _noise_fraction(policy, m.numel) * e_in):
        return m.error, SCALE
    return None


def judge(op: OpScore, by_name: dict[str, OpScore], policy: Policy, run_dtype: Optional[str] = None,
          floors: Optional[Mapping[int, MeasuredFloor]] = None) -> None:
    """Set op.local / op.blame / op.worst_out from its outputs against its inputs (floors: row
    index -> its measured noise floor, `noise.measured_floors`)."""
    e_in, s_in, op.worst_in = _input_error(op, by_name)
    op.error_in, op.scale_in = e_in, s_in
    if ops.traits(op.op).uninitialized:
        return
    best: Optional[tuple[float, int, str]] = None
    for row_index, m, tdt, gdt in op.outputs:
        found = _candidate(op, m, tdt, gdt, e_in, s_in, policy, run_dtype,
                           (floors or {}).get(row_index))
        if found is not None and (best is None or found[0] > best[0]):
            best = (found[0], row_index, found[1])
    if best is not None and not (op.const_diffs and not op.arg_diffs):
        # (an output that differs only through the dtype limits given is not this op's fault)
        op.local, op.worst_out, op.blame = True, best[1], best[2]


def _shows_error(op: OpScore, policy: Policy) -> bool:
    """Does any output of the op differ beyond its tolerance?"""
    for _, m, tdt, gdt in op.outputs:
        if m.nonfinite_mismatch or m.error > policy.tolerance_for(tdt, gdt) or op.local:
            return True
    return False


def _ancestors(name: Optional[str], parent: dict[str, str]) -> list[str]:
    out, seen = [], set()
    while name and name not in seen:
        seen.add(name)
        name = parent.get(name)
        if name:
            out.append(name)
    return out


def analyse(op_scores: list[OpScore], rows: list[TensorRow], policy: Policy,
            replay: Optional[Replayer] = None,
            replay_all: bool = False,
            withheld: Optional[Mapping[str, str]] = None) -> Optional[Divergence]:
    """Judge every op, rewrite row verdicts in place, and return the first divergence.

    replay: an `opdiff.comparison.replay.Replayer` over the target dump (needs its tensors), or None.
    It gives a second opinion (see `second_opinion`); replay_all replays every op it can.
    withheld: op name -> why it is never named (what it was computed from is not recorded:
    the parameter gradients of a compiled backward, compiled_backward.py); its output rows
    beyond their tolerance say that why.
    """
    withheld = withheld or {}
    by_name = {op.name: op for op in op_scores}
    run_dtype = run_precision(rows)
    # ops with DTensor shards placed differently in the two runs: nothing to judge them by
    unjudged = reasons.incomparable_ops(rows)
    floors = noise.measured_floors(rows, policy)        # `opdiff compare --noise`
    for op in op_scores:
        if op.name in unjudged:
            continue
        if op.kind == Kind.LEAF:
            origins.judge_leaf(op, policy, run_dtype, floors)
            continue
        judge(op, by_name, policy, run_dtype, floors)
        if op.kind == Kind.PARAM_GRAD and not any(n in by_name for n in linked(op)):
            op.local = False  # nothing recorded to say what its inputs were: cannot judge it
        if op.name in withheld:
            op.local = False
    noise.clear(op_scores, rows, policy, run_dtype)     # noise in, noise out (comparison/noise.py)
    if replay is not None:
        second_opinion(op_scores, rows, policy, replay, replay_all)
    for name in explained(op_scores, policy):
        by_name[name].local = False
    origins.judge_outside(op_scores, rows, policy, run_dtype)   # inputs changed outside torch
    for name in (unjudged | set(withheld)) & set(by_name):
        by_name[name].local = False
    for op in op_scores:
        if op.kind != REGION:   # (a region's rows are its caller's: pair.py)
            _revise_rows(op, rows, op.name in unjudged, withheld.get(op.name))
    origins.relate_to_first(op_scores, rows)   # rows after the first divergence
    shown = noise.measured_floors(rows, policy, judged=False)
    noise.say_multiples(rows, shown)
    return noise.with_multiple(first_divergence(op_scores, rows), rows, shown)


def first_divergence(op_scores: list[OpScore], rows: list[TensorRow]) -> Optional[Divergence]:
    """The Divergence of the earliest op still blamed, or None."""
    candidates = [op for op in op_scores if op.local]
    if not candidates:
        return None
    first = min(candidates, key=lambda o: o.seq)
    return origins.divergence(first, rows, op_scores)    # where it comes from: origins.RULES


def explained(op_scores: list[OpScore], policy: Policy) -> set[str]:
    """Names of local ops that other ops explain (the op is not named; see module docstring).

    Modules contain the ops run inside them. A module is named only when no op inside it
    shows the error at all (its own computation was not recorded op by op); if ops inside show
    it, the module is explained by them, be they local (named instead) or inherited. A module's
    parameter gradients are computed by the backward of the ops inside it, and may be recorded
    before those ops' backward records: name the op, not the gradient.
    """
    parent = {op.name: op.module for op in op_scores if op.module}
    # (a forward call is explained by forward ops only: the gradients its backward ops show
    # differ because its output does, and cannot say the call's own output was made inside)
    inner: dict[str, set[str]] = {Phase.FORWARD: set(), Phase.BACKWARD: set()}
    for op in op_scores:
        if op.kind == Kind.MODULE or not _shows_error(op, policy):
            continue
        side = inner[Phase.BACKWARD if op.phase == Phase.BACKWARD else Phase.FORWARD]
        side.update(_ancestors(op.name, parent))
        if op.forward:
            side.add(op.forward)
            side.update(_ancestors(op.forward, parent))
    either = inner[Phase.FORWARD] | inner[Phase.BACKWARD]
    out = set()
    for op in op_scores:
        shown = inner[Phase.BACKWARD if op.phase == Phase.BACKWARD else Phase.FORWARD]
        if op.kind == Kind.MODULE and op.local and (
                op.name in shown or (op.forward and op.forward in shown)):
            out.add(op.name)
        if op.kind == Kind.PARAM_GRAD and op.local and any(
                n in either for n in linked(op)[:1]):
            out.add(op.name)
    return out


def second_opinion(op_scores: list[OpScore], rows: list[TensorRow], policy: Policy, replay: Replayer,
                   replay_all: bool) -> None:
    """Let replay (the op re-run in float64 on the target's own inputs) confirm, clear or add
    culprits, replaying only what can change the answer:

    - the first candidate of the comparison is replayed: confirmed, it stays; cleared (its own
      error is what a CPU kernel of its dtype makes), the next candidate is looked at;
      not replayable (a module, a random op...), the comparison's verdict stands;
    - when the first candidate is a backward op, or there is none, every op before it is
      replayed too, in execution order: that is where accumulated error hides a wrong kernel
      from golden (a healthy bf16 gradient may differ from fp32 by 10%, a broken kernel by 1%;
      in a bf16 transformer with dropout a 1% forward fault in a linear layer hides the same way);
    - then every other op still blamed is replayed: confirmed, it stays an error; cleared, its
      rows say the difference is inherited.
    replay_all replays every op (the slow, thorough mode).

    With `replay.jobs` > 1 (OPDIFF_REPLAY_JOBS) the ops of that walk are replayed a few ahead
    in worker processes (`Replayer.judge_many`) and their verdicts applied in the same order,
    so the answer is the one-process answer.
    """
    order = sorted(op_scores, key=lambda o: o.seq)
    try:
        _second_opinion(op_scores, order, rows, policy, replay, replay_all)
    finally:
        replay.close()


# Replays run ahead of the walk, per worker process: a few wasted where a culprit turns up early.
AHEAD_PER_JOB = 4


def _second_opinion(op_scores: list[OpScore], order: list[OpScore], rows: list[TensorRow],
                    policy: Policy, replay: Replayer, replay_all: bool) -> None:
    window = [op for op in order if _replayable(op, replay)]
    parallel = replay.jobs > 1
    if replay_all:
        if parallel:
            replay.judge_many([op.name for op in window if op.kind != REGION])
        for op in window:
            _take(op, _replay(op, replay), rows, policy)
        return
    _walk(op_scores, order, window, rows, policy, replay)
    # The ops still blamed after the first divergence are errors in the table the user reads:
    # replay confirms or clears each (a ReLU backward whose mask follows the sign flips of its
    # forward input is innocent, although its output error is many times its inputs').
    first = _first_blamed(op_scores, order, policy)
    rest = [op for op in window if op.local and op is not first and op.replay is None]
    if parallel and len(rest) > 1:
        replay.judge_many([op.name for op in rest if op.kind != REGION])
    for op in rest:
        _take(op, _replay(op, replay), rows, policy)


def _first_blamed(op_scores: list[OpScore], order: list[OpScore], policy: Policy
                  ) -> Optional[OpScore]:
    cleared = explained(op_scores, policy)
    return next((op for op in order if op.local and op.name not in cleared), None)


def _walk(op_scores: list[OpScore], order: list[OpScore], window: list[OpScore],
          rows: list[TensorRow], policy: Policy, replay: Replayer) -> None:
    """The first divergence's replays (see `second_opinion`)."""
    parallel = replay.jobs > 1
    at = 0
    while True:
        first = _first_blamed(op_scores, order, policy)
        if first is None or first.phase == Phase.BACKWARD:
            limit = first.seq if first is not None else math.inf
            found = False
            while at < len(window) and window[at].seq < limit and not found:
                if parallel and window[at].name not in replay.done and \
                        window[at].kind != REGION:
                    ahead = [op.name for op in window[at:at + replay.jobs * AHEAD_PER_JOB]
                             if op.seq < limit and op.kind != REGION]
                    replay.judge_many(ahead)        # the verdicts are applied in order below
                op, at = window[at], at + 1
                found = _take(op, _replay(op, replay), rows, policy)
            if found:
                continue
        if first is None or first.replay is not None or not _replayable(first, replay):
            return
        _take(first, _replay(first, replay), rows, policy)
        if first.local:
            return


def _replayable(op: OpScore, replay: Replayer) -> bool:
    """An op replay may re-run, or a region (replayed as a chain, or told why not)."""
    return region_members(op) is not None or replay.can_replay(op.name)


def _replay(op: OpScore, replay: Replayer) -> LocalError:
    members = region_members(op)
    return replay.judge(op.name) if members is None else replay.judge_region(op.name, members)


def _take(op: OpScore, local: LocalError, rows: list[TensorRow], policy: Policy) -> bool:
    """Apply one replay verdict to an op; True when it makes the op a new culprit."""
    op.replay = local
    if not local.replayed:
        return False
    if not local.culprit and op.local and computes_another_function(op, local, rows, policy):
        return False                # right arithmetic, another function: it stays blamed
    if not local.culprit:
        # Its own error is the dtype's: the difference is inherited. Unless its number
        # arguments differ: replay ran on the target's, and cannot see that.
        op.local = op.local and bool(op.arg_diffs)
        return False
    if op.local:
        return False                # confirmed
    worst = cast("TensorLocalError", local.worst).name
    op.local, op.blame = True, REPLAY
    op.worst_out = next((i for i, *_ in op.outputs if made_tensor(op, rows[i].target_name) == worst),
                        op.outputs[0][0] if op.outputs else None)
    return True


def _revise_rows(op: OpScore, rows: list[TensorRow], unjudged: bool = False,
                 withheld: Optional[str] = None) -> None:
    for row_index, _, _, _ in op.outputs:
        row = rows[row_index]
        if op.local and row_index == op.worst_out and op.kind == Kind.LEAF:
            rows[row_index] = replace(row, result=ERROR, accuracy_reached="No",
                                      reason=f"{op.leaf or 'leaf'} {op.fqn} differs before any "
                                             f"op reads it: the origin")
        elif op.local and row_index == op.worst_out:
            # a random op whose generators were in other states: its draws differ, not its
            # arithmetic (the row says so, as the divergence does)
            random = origins.random_reason(op)
            rows[row_index] = replace(row, result=ERROR, accuracy_reached="No",
                                      reason=reasons.local_row(op, rows) if random is None
                                      else f"random draws differ: {random}")
        elif row.result == ERROR and withheld is not None:
            rows[row_index] = replace(row, result=WARNING, reason=f"{row.reason}; {withheld}")
        elif row.result == ERROR and not op.local:
            rows[row_index] = replace(row, result=WARNING, reason=reasons.not_judged(row.reason)
                                      if unjudged else reasons.not_this_op(op, row.reason))
    for row_index, _, _, _ in op.inputs:
        row = rows[row_index]
        if row.result == ERROR and row_index in op.leaf_inputs:
            rows[row_index] = replace(row, result=WARNING, reason=origins.leaf_input_reason(
                row.reason, op.leaf_inputs[row_index]))
        elif row.result == ERROR:
            rows[row_index] = replace(row, result=WARNING, reason=reasons.made_earlier(row.reason))


__all__ = ["OpScore", "analyse", "judge", "explained", "second_opinion", "first_divergence",
           "differing_numbers", "linked"]
