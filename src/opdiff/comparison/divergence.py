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
  any input noise may legitimately flip them. Ops returning uninitialised memory are never blamed.
- Python number arguments (`x[0] = 2.0`, `x * scale`) are inputs too: an op named whose number
  arguments differ between the runs is said to take the difference in through them, and replay
  (which re-runs it on the target's own arguments) does not clear it. Dtype limits are the
  exception: `masked_fill(mask, torch.finfo(dtype).min)` writes -65504 in fp16 and -3.4e38 in
  fp32 on purpose, and an op whose arguments differ only so is not named for its output.

When the target dump holds its tensors, replay (`opdiff.comparison.replay`) is a second, independent
opinion: the op re-run in float64 on the target's own inputs gives its own error, free of
anything inherited, and a CPU kernel of the target's dtype on the same inputs says how much of
that error the dtype explains. Replay confirms the comparison's culprit, clears it (its own
error is the dtype's: the difference was inherited after all), or names an op the comparison
cannot see: in backward, accumulated bf16 error (10% and more behind BatchNorm) hides a kernel
that is off by 1%. See `_second_opinion` for which ops get replayed.

With statistics alone (task="statistics": max, min, mean, norm, and no replay), every error
measured is a lower bound, the inputs' most of all: rounding noise averages out of their norms
and means, so "the inputs agree" cannot be established. An op is then blamed only for an error
above the statistics floors of `opdiff.comparison.verdicts` (what a healthy bf16 run showed, with
margin), and `statistics_limits` writes the note that says what that leaves unseen.

Besides picking the culprit, the analysis rewrites each row's verdict: an output beyond its
tolerance is an `error` only when its op made the error, and a `warning` ("inherited from the
inputs") otherwise; an input beyond its tolerance is a `warning` (it is some earlier op's output).
"""
from __future__ import annotations

import functools
import linecache
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..dtypes import canonical_dtype, coarser, is_float
from ..store.records import input_numbers
from .result import ERROR, PASS, UNMATCHED, WARNING, Divergence, Location, TensorRow

_UNINITIALISED = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}


@dataclass
class OpScore:
    """One paired op call and the rows of its tensors (indices into the row list)."""
    name: str
    op: str
    phase: str
    kind: str
    module: Optional[str]
    forward: Optional[str]
    seq: int
    location: Optional[Location]
    inputs: list = field(default_factory=list)     # [(row index, Measurement, t dtype, g dtype)]
    outputs: list = field(default_factory=list)
    local: bool = False
    why: str = ""
    worst_out: Optional[int] = None
    worst_in: Optional[int] = None
    error_in: float = 0.0
    scale_in: float = 0.0
    replay: Any = None          # opdiff.comparison.replay.LocalError once the op was replayed
    paired: bool = True         # False: only the target has this op (judged by replay alone)
    arg_diffs: list = field(default_factory=list)   # number arguments that differ, as text
    const_diffs: list = field(default_factory=list)  # ... that are dtype limits (finfo.min)


def differing_numbers(t_rec: dict, g_rec: dict) -> tuple[list[str], list[str]]:
    """The Python number arguments of a paired call that differ (`x[0] = 2.0` against
    `x[0] = 1.0`), as "input.2: 2 vs 1": (those that differ, those that are dtype limits).

    Floats within 1e-6 of their size are equal (a value read from a float32 tensor differs by
    its rounding); ints and bools must be equal. Dtype limits differ on purpose: a run in fp16
    passes `torch.finfo(torch.float16).min` where the fp32 run passes float32's (the usual
    attention mask), with the same effect, but an output that holds them differs by 1e38.
    """
    golden = input_numbers(g_rec)
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
def _dtype_limits() -> frozenset:
    """The largest values of the float dtypes, both signs: what code writes where it means
    -inf or +inf. (Epsilons are left out: `var + finfo(dtype).eps` with fp16's 1e-3 against
    fp32's 1e-7 can be the very difference the user is looking for.)"""
    import torch
    values = set()
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        info = torch.finfo(dtype)
        values.update((float(info.max), float(info.min)))
    return frozenset(values)


def _linked(op: OpScore) -> list[str]:
    """Records whose tensors the op's computation also read (see module docstring)."""
    if op.kind == "param_grad" and ".parameters_grad." in op.name:
        # Module.fc.Linear.parameters_grad.0: dW = f(forward input, grad of forward output)
        prefix, _, call = op.name.rpartition(".parameters_grad.")
        return [f"{prefix}.forward.{call}", f"{prefix}.backward.{call}"]
    if op.phase == "backward" and op.forward:
        return [op.forward]
    return []


def _input_error(op: OpScore, by_name: dict) -> tuple[float, float, Optional[int]]:
    entries = list(op.inputs)
    for name in _linked(op):
        if name in by_name:
            other = by_name[name]
            entries += other.inputs + (other.outputs if other.phase == "forward" else [])
    err, scale, worst = 0.0, 0.0, None
    for row_index, m, _, _ in entries:
        e = math.inf if m.nonfinite_mismatch else m.error
        if e > err or worst is None:
            err, worst = max(err, e), row_index
        if not m.nonfinite_mismatch:
            scale = max(scale, abs(m.scale_error))
    return err, scale, worst


def run_precision(rows: list[TensorRow]) -> Optional[str]:
    """The coarsest float dtype of the compare: in a bf16 autocast run even fp32 ops handle values
    that carry bf16 noise, so no op is held to a finer floor than the run's precision."""
    coarsest = None
    seen = set()
    for row in rows:
        for dt in (row.target_dtype, row.golden_dtype):
            if dt and dt not in seen:
                seen.add(dt)
                if is_float(dt):
                    coarsest = dt if coarsest is None else coarser(coarsest, dt)
    return coarsest


def _noise_fraction(policy, numel: int) -> float:
    """How much of the input's random error may show up as a scale error of the output: little
    for big tensors (it averages out), all of it for a handful of elements."""
    return min(1.0, max(policy.thresholds.scale_noise_fraction, 4.0 / math.sqrt(max(numel, 1))))


def _statistics_floor(policy, tdt, gdt, run_dtype, phase: str, numel: int,
                      scale: bool = False) -> float:
    """The least error statistics alone may blame an op for (see `opdiff.comparison.verdicts`)."""
    return max(policy.statistics_tolerance_for(tdt, gdt, phase, numel, scale=scale),
               policy.statistics_tolerance_for(run_dtype, run_dtype, phase, numel, scale=scale))


def _judge_op(op: OpScore, by_name: dict, policy, run_dtype: Optional[str] = None) -> None:
    """Set op.local / op.why / op.worst_out from its outputs against its inputs."""
    e_in, s_in, op.worst_in = _input_error(op, by_name)
    op.error_in, op.scale_in = e_in, s_in
    if op.op.rsplit(".", 1)[-1] in _UNINITIALISED:
        return
    amp = policy.amplification
    best = None
    for row_index, m, tdt, gdt in op.outputs:
        if m.nonfinite_mismatch:
            if math.isfinite(e_in):
                why = f"inf/NaN appear here ({m.message})"
                cand = (math.inf, row_index, why)
            else:
                continue
        elif not (is_float(tdt) or is_float(gdt)):
            if e_in == 0.0 and m.error > 0:
                cand = (m.error, row_index, "integer output differs although the inputs are equal")
            else:
                continue
        else:
            tol = max(policy.tolerance_for(tdt, gdt), policy.tolerance_for(run_dtype, run_dtype))
            stol = max(policy.scale_tolerance_for(tdt, gdt),
                       policy.scale_tolerance_for(run_dtype, run_dtype))
            if m.mode == "statistics":
                tol = max(tol, _statistics_floor(policy, tdt, gdt, run_dtype, op.phase, m.numel))
                stol = max(stol, _statistics_floor(policy, tdt, gdt, run_dtype, op.phase,
                                                   m.numel, scale=True))
            s = abs(m.scale_error)
            if m.error > tol and m.error > amp * e_in:
                why = "random"
            elif (m.numel >= policy.thresholds.scale_min_numel
                  and s > stol + policy.thresholds.scale_amplification * s_in
                  and s > _noise_fraction(policy, m.numel) * e_in):
                why = "scale"
            else:
                continue
            cand = (m.error, row_index, why)
        if best is None or cand[0] > best[0]:
            best = cand
    if best is not None and not (op.const_diffs and not op.arg_diffs):
        # (an output that differs only through the dtype limits given is not this op's fault)
        op.local, op.worst_out, op.why = True, best[1], best[2]


def _shows_error(op: OpScore, policy) -> bool:
    """Does any output of the op differ beyond its tolerance?"""
    for _, m, tdt, gdt in op.outputs:
        if m.nonfinite_mismatch or m.error > policy.tolerance_for(tdt, gdt) or op.local:
            return True
    return False


def _ancestors(name: Optional[str], parent: dict) -> list[str]:
    out, seen = [], set()
    while name and name not in seen:
        seen.add(name)
        name = parent.get(name)
        if name:
            out.append(name)
    return out


def source_context(location: Optional[Location], radius: int = 2) -> tuple:
    """(line number, text) pairs around a location, when the file is readable."""
    if location is None or not location.file or not os.path.isfile(location.file):
        return ()
    lines = []
    for n in range(max(1, location.line - radius), location.line + radius + 1):
        text = linecache.getline(location.file, n)
        if text:
            lines.append((n, text.rstrip("\n")))
    return tuple(lines)


def _fmt(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    return f"{x:.6f}" if isinstance(x, float) and abs(x) <= 1 and abs(x) > 0.99 else f"{x:.3g}"


def _stat_pair(row: TensorRow, key: str) -> str:
    return f"{_fmt(row.target_stats.get(key))} vs {_fmt(row.golden_stats.get(key))}"


def _describe_statistics(op: OpScore, out: TensorRow, inp: Optional[TensorRow], verdict: str) -> str:
    """The reason when only statistics were compared: no cosine or max abs err to quote."""
    inputs = ("no inputs to compare" if inp is None else
              f"the inputs' statistics agree (worst differs by {_fmt(op.error_in)} of its size)")
    if op.why == "scale":
        moved = (f"its L2 norm is {1 + out.scale_error:.6g} times golden's "
                 f"(inputs {1 + op.scale_in:.6g})")
    else:
        moved = f"its statistics differ by {_fmt(out.error)} of its size"
    return (f"{inputs}, the output's do not: {moved}; max {_stat_pair(out, 'max')}, "
            f"min {_stat_pair(out, 'min')}, mean {_stat_pair(out, 'mean')} — {verdict} (judged "
            f"from statistics only)")


def _describe(op: OpScore, rows: list) -> str:
    if op.arg_diffs and op.why != "replay":
        return _describe_error(op, rows, (
            f"its number arguments differ ({', '.join(op.arg_diffs[:3])}): the difference enters "
            f"the computation here, through them"))
    return _describe_error(op, rows)


def _describe_error(op: OpScore, rows: list, verdict: str = "local error in this op") -> str:
    out = rows[op.worst_out] if op.worst_out is not None else None
    inp = rows[op.worst_in] if op.worst_in is not None else None
    if out is not None and out.mode == "statistics" and op.why in ("scale", "random"):
        return _describe_statistics(op, out, inp, verdict)
    if inp is None:
        inputs = "no inputs to compare"
    else:
        inputs = (f"inputs agree (cosine {_fmt(inp.metrics.get('Cosine'))}, "
                  f"rel err {_fmt(op.error_in)})")
    if op.why == "replay" and not op.paired:
        return (f"the golden run has no such op to compare with, but {op.replay.describe()} "
                f"— local error in this op")
    if op.why == "replay":
        # Found by replay alone: golden cannot tell this op's error from what it inherited.
        seen = f", output rel err {_fmt(out.error)}" if out is not None else ""
        return (f"compared with golden its error is not distinguishable from what its inputs "
                f"carry (input rel err {_fmt(op.error_in)}{seen}), but {op.replay.describe()} "
                f"— local error in this op")
    if op.why == "scale":
        output = (f"output does not: it is scaled by {1 + out.scale_error:.6g} relative to golden "
                  f"(inputs {1 + op.scale_in:.6g}; cosine {_fmt(out.metrics.get('Cosine'))}, "
                  f"max abs err {_fmt(out.metrics.get('MaxAbsErr'))})")
    elif op.why == "random":
        output = (f"output does not (cosine {_fmt(out.metrics.get('Cosine'))}, max abs err "
                  f"{_fmt(out.metrics.get('MaxAbsErr'))}, rel err {_fmt(out.error)})")
    else:
        output = f"output does not: {op.why}"
    confirmed = f"; {op.replay.describe()}" if op.replay is not None and op.replay.culprit else ""
    return f"{inputs}, {output} — {verdict}{confirmed}"


def analyse(ops: list[OpScore], rows: list[TensorRow], policy, replay=None,
            replay_all: bool = False) -> Optional[Divergence]:
    """Judge every op, rewrite row verdicts in place, and return the first divergence.

    replay: an `opdiff.comparison.replay.Replayer` over the target dump (needs its tensors), or None.
    It gives a second opinion (see `_second_opinion`); replay_all replays every op it can.
    """
    by_name = {op.name: op for op in ops}
    run_dtype = run_precision(rows)
    for op in ops:
        _judge_op(op, by_name, policy, run_dtype)
        if op.kind == "param_grad" and not any(n in by_name for n in _linked(op)):
            op.local = False  # nothing recorded to say what its inputs were: cannot judge it
    if replay is not None:
        _second_opinion(ops, rows, policy, replay, replay_all)
    explained = _explained(ops, policy)
    for op in ops:
        if op.name in explained:
            op.local = False

    for op in ops:
        _revise_rows(op, rows)
    candidates = [op for op in ops if op.local]
    if not candidates:
        return None
    first = min(candidates, key=lambda o: o.seq)
    out = rows[first.worst_out] if first.worst_out is not None else None
    inp = rows[first.worst_in] if first.worst_in is not None else None
    tensor = out.target_name if out is not None else (
        first.replay.worst.name if first.replay is not None and first.replay.worst else None)
    return Divergence(
        name=first.name, op=first.op, phase=first.phase, reason=_describe(first, rows),
        location=first.location, metrics=dict(out.metrics) if out is not None else {},
        tensor=tensor, input_metrics=dict(inp.metrics) if inp is not None else {},
        module=first.module, context=source_context(first.location))


def _explained(ops: list[OpScore], policy) -> set:
    """Names of local ops that other ops explain (the op is not named; see module docstring).

    Modules contain the ops run inside them. A module is named only when no op inside it
    shows the error at all (its own computation was not recorded op by op); if ops inside show
    it, the module is explained by them, be they local (named instead) or inherited. A module's
    parameter gradients are computed by the backward of the ops inside it, and may be recorded
    before those ops' backward records: name the op, not the gradient.
    """
    parent = {op.name: op.module for op in ops if op.module}
    inner_diverged: set[str] = set()
    for op in ops:
        if op.kind == "module" or not _shows_error(op, policy):
            continue
        inner_diverged.update(_ancestors(op.name, parent))
        if op.forward:
            inner_diverged.add(op.forward)
            inner_diverged.update(_ancestors(op.forward, parent))
    out = set()
    for op in ops:
        if op.kind == "module" and op.local and (
                op.name in inner_diverged or (op.forward and op.forward in inner_diverged)):
            out.add(op.name)
        if op.kind == "param_grad" and op.local and any(
                n in inner_diverged for n in _linked(op)[:1]):
            out.add(op.name)
    return out


def _second_opinion(ops: list[OpScore], rows: list, policy, replay, replay_all: bool) -> None:
    """Let replay (the op re-run in float64 on the target's own inputs) confirm, clear or add
    culprits, replaying only what can change the answer:

    - the first candidate of the comparison is replayed: confirmed, it stays; cleared (its own
      error is what a CPU kernel of its dtype makes), the next candidate is looked at;
      not replayable (a module, a random op...), the comparison's verdict stands;
    - when the first candidate is a backward op, or there is none, every op before it is
      replayed too, in execution order: that is where accumulated error hides a wrong kernel
      from golden (a healthy bf16 gradient may differ from fp32 by 10%, a broken kernel by 1%;
      in a bf16 transformer with dropout a 1% forward fault in a linear layer hides the same way).
    replay_all replays every op (the slow, thorough mode).
    """
    order = sorted(ops, key=lambda o: o.seq)
    if replay_all:
        for op in order:
            if replay.can_replay(op.name):
                _take(op, replay.judge(op.name), rows)
        return
    window = iter([op for op in order if replay.can_replay(op.name)])
    pending = next(window, None)
    while True:
        explained = _explained(ops, policy)
        first = next((op for op in order if op.local and op.name not in explained), None)
        if first is None or first.phase == "backward":
            limit = first.seq if first is not None else math.inf
            found = False
            while pending is not None and pending.seq < limit and not found:
                op, pending = pending, next(window, None)
                found = _take(op, replay.judge(op.name), rows)
            if found:
                continue
        if first is None or first.replay is not None or not replay.can_replay(first.name):
            return
        _take(first, replay.judge(first.name), rows)
        if first.local:
            return


def _take(op: OpScore, local, rows: list) -> bool:
    """Apply one replay verdict to an op; True when it makes the op a new culprit."""
    op.replay = local
    if not local.replayed:
        return False
    if not local.culprit:
        # Its own error is the dtype's: the difference is inherited. Unless its number
        # arguments differ: replay ran on the target's, and cannot see that.
        op.local = op.local and bool(op.arg_diffs)
        return False
    if op.local:
        return False                # confirmed
    worst = local.worst.name
    op.local, op.why = True, "replay"
    op.worst_out = next((i for i, *_ in op.outputs if rows[i].target_name == worst),
                        op.outputs[0][0] if op.outputs else None)
    return True


def _revise_rows(op: OpScore, rows: list[TensorRow]) -> None:
    for row_index, _, _, _ in op.outputs:
        row = rows[row_index]
        if op.local and row_index == op.worst_out:
            rows[row_index] = replace(row, result=ERROR, accuracy_reached="No",
                                      reason="local error: " + _describe(op, rows))
        elif row.result == ERROR and not op.local:
            replayed = (f"; {op.replay.describe()}" if op.replay is not None and op.replay.replayed
                        else "")
            cause = (f"through the dtype limits it was given ({', '.join(op.const_diffs[:3])}), "
                     f"as intended" if op.const_diffs and not op.arg_diffs else
                     f"inherited from the inputs (input rel err {_fmt(op.error_in)})")
            rows[row_index] = replace(row, result=WARNING, reason=f"{row.reason}; {cause}{replayed}")
    for row_index, _, _, _ in op.inputs:
        row = rows[row_index]
        if row.result == ERROR:
            rows[row_index] = replace(row, result=WARNING, reason=(
                f"{row.reason}; already differs when it reaches this op (made earlier)"))


def statistics_limits(rows: list[TensorRow], policy, replayed: bool = False) -> Optional[str]:
    """A note on what a compare of statistics alone cannot see, or None when whole tensors
    were compared. Statistics hide most of an input's error (random rounding noise averages out
    of a norm or a mean), so an op is blamed only for errors above the floors of
    `opdiff.comparison.verdicts` (`statistics_tolerance`); smaller ones stay unnamed."""
    paired = [r for r in rows if r.result != UNMATCHED]
    stats = [r for r in paired if r.mode == "statistics"]
    if not stats:
        return None
    dtype = canonical_dtype(run_precision(rows)) or "float32"
    def pct(phase, scale=False):
        return f"{100 * policy.statistics_tolerance_for(dtype, dtype, phase, scale=scale):.2g}%"

    limits = []
    if any(r.phase != "backward" for r in stats):
        limits.append(f"{pct('forward', True)} (its norm) or {pct('forward')} (its max, min or "
                      f"mean) in forward")
    if any(r.phase == "backward" for r in stats):
        limits.append(f"{pct('backward')} in backward")
    limits = ", ".join(limits)
    how = ("dump both runs with task='tensor' to compare whole tensors" if replayed else
           "dump with task='tensor' to compare whole tensors and replay ops in float64")
    which = "" if len(stats) == len(paired) else f" for {len(stats)} of {len(paired)} tensors"
    return (f"statistics only{which}: an op is named only when its output's statistics move by "
            f"more than {limits}, relative to the tensor's magnitude (more for "
            f"tensors of under {policy.thresholds.statistics_small_numel} elements); smaller "
            f"errors cannot be told apart from {dtype} rounding here; {how}")


def count(rows: list[TensorRow]) -> dict:
    counts = {PASS: 0, WARNING: 0, ERROR: 0, UNMATCHED: 0}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    return counts
