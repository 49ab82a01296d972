"""An op's own (local) error, measured by re-running it on the target's own data.

    from opdiff.comparison.replay.local import replay_record
    local = replay_record(record, dump.tensor, forward_record=None)
    local.culprit, local.describe()

Forward: the op runs in float64 on the target's recorded inputs; the target's recorded outputs
are compared with that. Nothing the inputs inherited enters: this is the op's own error.
Backward (a record with a `forward` link): the forward call runs in float64 with the inputs
that received gradients as leaves, and `torch.autograd.grad` with the backward record's inputs
(gradients w.r.t. the forward outputs) gives the expected gradients, compared with the backward
record's outputs (one per tensor argument of the forward call).

How much error the op's dtype explains is measured, not assumed (the "dual benchmark"): the same
call also runs on CPU in the target's dtypes (under CPU autocast when that is what reproduces
the recorded output dtypes), and the target's kernel is blamed only when its error against
float64 is well above that reference kernel's (the rules, in `opdiff.comparison.replay.rules`:
within 3x the reference's relative L2 error as `torch._dynamo.utils.same` has it, and a scale
rule that finds a 1e-2 fault in a bf16 op whose rounding error alone is larger). The compare's
replay runs that reference only where the float64 result alone cannot settle the verdict
(`rules.settle`: the same verdicts); `replay.tensors.replay_tensors` (`opdiff check`) always runs it.

Ops that consume random numbers (the CPU generator advances while replaying them) are not
replayed, nor are ops whose recorded dtypes or shapes the replay cannot reproduce.

Every replay runs on one CPU thread (`one_thread`): a reduction's rounding depends on how the
threads split it, and one thread makes the float64 and reference results the same in every
process (`--jobs`, Ray workers, the compare's replay). Parallelism comes from replaying ops in
several processes; on a shared machine one thread per op is also the faster choice (measured
in benchmarks/bench_check.py: a 45-op CNN check took 0.3 s on one thread, 4.8 s on two).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from ... import ops
from ...numbers import human
from ...store.records import iter_tensors
from .calls import (NotReplayable, dtype_signature, flat_descriptors, flat_tensors, read_once,
                    rebuild_call)
from .direct import (backward_float32, backward_reference, exact_in_dtype, forward_float32,
                     sample_autocast)
from .running import autocast_to, rng_guard, shielded, threads, vjp
from .rules import (RATIO, SIGMAS, TensorLocalError, judge_bounded, judge_measured, judge_tensor,
                    settle)
from .calls import Load
from ...store.schema import Descriptor, Record

if TYPE_CHECKING:
    from ..verdicts import Policy

REPLAY_THREADS = 1

__all__ = ["RATIO", "SIGMAS", "TensorLocalError", "LocalError", "judge_tensor", "judge_measured",
           "settle", "replay_record", "one_thread"]

_LOW = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class LocalError:
    """The replay verdict for one record (see module docstring)."""
    name: str
    replayed: bool
    reason: str = ""                        # why it was not replayed
    reference: str = ""                     # e.g. "bfloat16 CPU kernel (autocast)"
    tensors: tuple[TensorLocalError, ...] = ()   # per compared output
    seconds: float = 0.0

    @property
    def culprit(self) -> bool:
        return self.replayed and any(t.culprit for t in self.tensors)

    @property
    def worst(self) -> Optional[TensorLocalError]:
        """The culprit tensor with the largest excess, else the one with the largest error."""
        if not self.tensors:
            return None
        bad = [t for t in self.tensors if t.culprit]
        pool = bad or list(self.tensors)
        return max(pool, key=lambda t: (_excess(t), t.error))

    def describe(self) -> str:
        """One clause for a Divergence reason or a row."""
        w = self.worst
        if not self.replayed or w is None:
            return f"not replayed: {self.reason}"
        what = "gradient" if ".backward." in w.name else "output"
        if w.culprit == "nonfinite":
            also = ("a CPU kernel of its dtype overflows too" if math.isinf(w.reference_error)
                    or math.isnan(w.reference_error) else
                    f"a {self.reference} stays finite")
            return (f"replayed in float64 on the target's own inputs the {what} is finite, the "
                    f"target's has inf/NaN ({also})")
        scale = ""
        if w.culprit == "scale" or abs(w.scale_error) > abs(w.reference_scale_error) * 2:
            scale = (f", scaled by {1 + w.scale_error:.6g} against "
                     f"{1 + w.reference_scale_error:.6g}")
        which = w.name[len(self.name) + 1:] if w.name.startswith(self.name + ".") else w.name
        if not w.reference_run:
            return (f"replayed in float64 on the target's own inputs, the op's own {what} error "
                    f"is {human(w.error)} ({which}, {w.dtype}), within what {self.reference} "
                    f"alone makes (at least {human(w.reference_error)}): no kernel of its dtype "
                    f"does clearly better")
        return (f"replayed in float64 on the target's own inputs, the op's own {what} error is "
                f"{human(w.error)} ({which}, {w.dtype}), a {self.reference}'s is "
                f"{human(w.reference_error)}{scale}")


def _excess(t: TensorLocalError) -> float:
    if t.culprit in ("nonfinite", "integer"):
        return math.inf
    ratio = t.error / max(t.reference_error, 1e-30)
    return max(ratio, abs(t.scale_error) / max(abs(t.reference_scale_error), 1e-30))


# -- running a call -------------------------------------------------------------------------------

def one_thread() -> contextlib.AbstractContextManager[None]:
    """Run the block on `REPLAY_THREADS` intra-op CPU threads (see the module docstring)."""
    return threads(REPLAY_THREADS)


def _run(record: Record, load: Load, cast: Optional[torch.dtype],
         autocast: Optional[torch.dtype], leaves_for: Optional[list[int]] = None,
         grads: Optional[dict[int, torch.Tensor]] = None, device: str = "cpu",
         seen: Optional[list[torch.dtype]] = None) -> list[Any]:
    """Run a record's call and return its output tensors; with `leaves_for` (indices of the
    argument tensors that get gradients) and `grads` ({output index: gradient}), return the
    gradient of each of those arguments instead. seen: gets the dtypes of the call's outputs."""
    leaf_by_key: dict[str, torch.Tensor] = {}
    wrap = None
    if leaves_for is not None:
        keys = [d.get("key") for d in flat_descriptors(
            list(record["inputs"]) + list(record["kwargs"].values()))]
        want = {keys[i] for i in leaves_for if i < len(keys) and keys[i]}

        def leaf_wrap(key: str, t: torch.Tensor) -> torch.Tensor:
            # Leaves get gradients; the call gets a copy, so an in-place op may write into it.
            if key in want and (t.is_floating_point() or t.is_complex()):
                leaf_by_key[key] = t.detach().requires_grad_(True)
                return leaf_by_key[key].clone()
            return t
        wrap = leaf_wrap

    call = rebuild_call(record, load, cast, wrap=wrap, device=device)
    with rng_guard() as rng, autocast_to(autocast, device), torch.set_grad_enabled(leaves_for is not None):
        out = call.run()
    if rng["consumed"]:
        raise NotReplayable("it draws random numbers (a new draw would not match the target's)")
    if out is None and ops.traits(record["op"]).returns_first_argument and call.args:
        out = call.args[0]      # as the capture records it
    outs = flat_tensors([out] if not isinstance(out, (tuple, list)) else out)
    if seen is not None:
        seen.extend(o.dtype for o in outs)
    if leaves_for is None:
        return outs
    pairs = [(outs[j], g) for j, g in (grads or {}).items()
             if j < len(outs) and outs[j].requires_grad]
    if not pairs:
        raise NotReplayable("no recorded output gradient reaches the replayed outputs")
    leaf_keys = list(leaf_by_key)
    got = vjp(pairs, [leaf_by_key[k] for k in leaf_keys])
    by_key = {k: (g if g is not None else torch.zeros_like(leaf_by_key[k]))
              for k, g in zip(leaf_keys, got)}
    return [by_key.get(call.tensors[i][0]) if i < len(call.tensors) else None for i in leaves_for]


def _reference(record: Record, load: Load,
               recorded: list[Optional[torch.dtype]],
               known: Optional[dict[str, Optional[torch.dtype]]] = None,
               leaves_for: Optional[list[int]] = None,
               grads: Optional[dict[int, torch.Tensor]] = None,
               ) -> tuple[Optional[torch.dtype], list[Any]]:
    """Run the call on CPU in the target's dtypes: as recorded, or under CPU autocast when that
    is what reproduces the recorded output dtypes (the target ran under autocast).
    Returns (autocast dtype or None, output tensors; with `leaves_for` and `grads`, the
    gradients as `_run` gives them, found in the same run)."""
    low = sorted({d for d in recorded if d in _LOW}, key=str)
    name = record["name"]
    # Found for this record before (its forward, say): one run instead of up to three. Found
    # for a call of the same op on the same dtypes: tried first (the autocast rules depend on
    # the op and the dtypes alone), the others after it.
    sig = dtype_signature(record, recorded)
    if known is not None and name in known:
        candidates = [known[name]]
    elif known is not None and sig in known:
        candidates = [known[sig]] + [c for c in [None, *low] if c != known[sig]]
    else:
        candidates = [None, *low]
    for at, autocast in enumerate(candidates):
        dtypes: list[torch.dtype] = []
        try:
            outs = _run(record, load, None, autocast, leaves_for, grads, seen=dtypes)
        except NotReplayable:
            raise
        except Exception as exc:
            if at + 1 < len(candidates) and (autocast is None or candidates[0] is not None):
                continue
            raise NotReplayable(f"the CPU kernel in the target's dtypes fails ({_short(exc)})")
        if dtypes == recorded:
            if known is not None:
                known[name] = known[sig] = autocast
            return autocast, outs
    raise NotReplayable("the CPU kernel does not reproduce the target's output dtypes")


def _short(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) <= 100 else text[:97] + "..."


def _dtype(desc: Descriptor) -> Optional[torch.dtype]:
    return getattr(torch, str(desc.get("dtype", "")).replace("torch.", ""), None)


def _load_target(load: Load, desc: Descriptor, where: str) -> torch.Tensor:
    t: Optional[torch.Tensor] = load(desc["key"]) if desc.get("key") else None
    if t is None:
        raise NotReplayable(f"{where} was not saved")
    return t


def replay_record(record: Record, load: Load, policy: "Policy",
                  forward_record: Optional[Record] = None,
                  known: Optional[dict[str, Optional[torch.dtype]]] = None,
                  shortcut: bool = True) -> LocalError:
    """The local error of one record (see module docstring). Never raises for a record that
    cannot be replayed: the LocalError says why (`replayed` False).

    shortcut: run the reference kernel only for an output that `rules.settle` cannot settle
    from the float64 result alone (the same verdicts; False runs it for every output). Each
    saved tensor is read once per record (the float64 and reference runs share it: every
    run makes its own copy)."""
    start = time.perf_counter()
    load = read_once(load)
    try:
        with one_thread():
            if record["phase"] == "backward" and record["kind"] != "aten":
                if forward_record is None:
                    raise NotReplayable("its forward call is not in the dump")
                ref, tensors = _backward(record, forward_record, load, policy, known, shortcut)
            else:
                ref, tensors = _forward(record, load, policy, known, shortcut)
    except NotReplayable as exc:
        return LocalError(record["name"], False, reason=str(exc),
                          seconds=time.perf_counter() - start)
    except Exception as exc:  # a call torch refuses: say so, never guess
        return LocalError(record["name"], False, reason=f"replay failed ({_short(exc)})",
                          seconds=time.perf_counter() - start)
    return LocalError(record["name"], True, reference=ref, tensors=tuple(tensors),
                      seconds=time.perf_counter() - start)


def _reference_name(dtypes: list[Optional[torch.dtype]], autocast: Optional[torch.dtype]) -> str:
    if autocast is not None:
        return f"{str(autocast).replace('torch.', '')} CPU kernel (autocast)"
    floats = [d for d in dtypes if d is not None and d.is_floating_point]
    low = min(floats, key=lambda d: torch.finfo(d).bits) if floats else None
    return f"{str(low).replace('torch.', '')} CPU kernel" if low else "CPU kernel"


def compute_dtype(*records: Record) -> Optional[str]:
    """The lowest-precision floating dtype among the records' tensors (inputs and outputs):
    what a correct kernel of the op may compute its intermediate values in
    (`rules.judge_tensor`'s `compute`)."""
    floats = [d for r in records for _, _, desc in iter_tensors(r)
              for d in (_dtype(desc),) if d is not None and d.is_floating_point]
    if not floats:
        return None
    return str(min(floats, key=lambda d: torch.finfo(d).bits)).replace("torch.", "")


def _forward(record: Record, load: Load, policy: "Policy",
             known: Optional[dict[str, Optional[torch.dtype]]] = None, shortcut: bool = True
             ) -> tuple[str, list[TensorLocalError]]:
    quick = _settled_float32(record, load, policy) if shortcut else None
    if quick is not None:
        return quick
    low = compute_dtype(record)
    outputs, recorded, exact = _forward_exact(record, load, native=shortcut)
    targets = [_load_target(load, d, name) for name, d in outputs]
    out = _checked([name for name, _ in outputs], targets, exact)
    settled = [settle(n, t, e, policy, compute=low) if shortcut else None for n, t, e in out]
    if all(s is not None for s in settled):
        return _floor_name(recorded), [s for s in settled if s is not None]
    with shielded():
        autocast, reference = _reference(record, load, recorded, known)
    return _reference_name(recorded, autocast), [
        s if s is not None else judge_tensor(n, t, e, r, policy, low)
        for s, (n, t, e), r in zip(settled, out, reference)]


def _settled_float32(record: Record, load: Load, policy: "Policy"
                     ) -> Optional[tuple[str, list[TensorLocalError]]]:
    """A low-precision output settled on a float32 run with a proven bound (a conv2d:
    `direct.forward_float32`), else None: the float64 run decides. (A float32 output's rounding
    floor is too close to the bound to settle anything: not tried.)"""
    outputs = [(name, d) for name, role, d in iter_tensors(record) if role == "output"]
    recorded = [_dtype(d) for _, d in outputs]
    if not outputs or any(d not in _LOW for d in recorded):
        return None
    with shielded():
        approx = forward_float32(record, load)
    if approx is None or len(approx[0]) != len(outputs):
        return None
    targets = [_load_target(load, d, name) for name, d in outputs]
    out = _checked([name for name, _ in outputs], targets, approx[0])
    low = compute_dtype(record)
    settled = [settle(n, t, e, policy, slack, low) for (n, t, e), slack in zip(out, approx[1])]
    if any(s is None for s in settled):
        return None
    return _floor_name(recorded), [s for s in settled if s is not None]


def _backward(record: Record, fwd: Record, load: Load,
              policy: "Policy", known: Optional[dict[str, Optional[torch.dtype]]] = None,
              shortcut: bool = True) -> tuple[str, list[TensorLocalError]]:
    leaves, g_plain, recorded, exact, slacks = _backward_exact(record, fwd, load, shortcut)
    low = compute_dtype(record, fwd)
    names = [f"{record['name']}.output.{i}" for i in leaves]
    targets = [_load_target(load, record["outputs"][i], n) for i, n in zip(leaves, names)]
    out = _checked(names, targets, exact)
    settled = [settle(n, t, e, policy, slack, low) if shortcut else None
               for (n, t, e), slack in zip(out, slacks)]
    if all(s is not None for s in settled):
        return _floor_name(recorded), [s for s in settled if s is not None]
    # The reference computes only the gradients not settled (a conv's weight gradient, say).
    need = [i for i, s in zip(leaves, settled) if s is None]
    with shielded():
        autocast, needed = _backward_reference(fwd, load, need, g_plain, known)
    by_leaf = dict(zip(need, needed))
    judged = []
    for i, s, (n, t, e), slack in zip(leaves, settled, out, slacks):
        if s is None:
            r = by_leaf.get(i)
            if r is None or t.dtype != r.dtype:
                raise NotReplayable(f"{n}: replayed {r.dtype if r is not None else None}, dump "
                                    f"{t.dtype}")
            s = judge_bounded(n, t, e, slack, r, policy, low) if slack > 0 else None
            if s is None:     # (a bounded float32 result that cannot decide: float64 does)
                e = e if slack == 0 else _checked([n], [t], _exact_leaves(fwd, load, [i],
                                                                          g_plain))[0][2]
                s = judge_tensor(n, t, e, r, policy, low)
        judged.append(s)
    return _reference_name(recorded, autocast), judged


def _checked(names: list[str], targets: list[torch.Tensor], exact: list[Any]
             ) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, target, float64 result) per output; NotReplayable when a shape differs."""
    out = []
    for name, t, e in zip(names, targets, exact):
        if e is None:
            raise NotReplayable(f"{name}: the forward call has no such tensor argument")
        if tuple(t.shape) != tuple(e.shape):
            raise NotReplayable(f"{name}: replayed shape {list(e.shape)}, dump {list(t.shape)}")
        out.append((name, t, e))
    return out


def _floor_name(dtypes: list[Optional[torch.dtype]]) -> str:
    floats = [d for d in dtypes if d is not None and d.is_floating_point]
    low = min(floats, key=lambda d: torch.finfo(d).bits) if floats else None
    return f"rounding to {str(low).replace('torch.', '')}" if low else "exact result"


def _forward_exact(record: Record, load: Load, native: bool = False
                   ) -> tuple[list[tuple[str, Descriptor]], list[Optional[torch.dtype]],
                              list[Any]]:
    """The record's outputs (name, descriptor), their recorded dtypes and the float64 run
    (native: the run in the inputs' dtype where that is the float64 result exactly,
    `direct.exact_in_dtype`; the compare's settle reads it, `opdiff check` gets float64)."""
    outputs = [(name, d) for name, role, d in iter_tensors(record) if role == "output"]
    if not outputs:
        raise NotReplayable("it has no output tensor to compare")
    recorded = [_dtype(d) for _, d in outputs]
    with shielded():
        cast = None if native and exact_in_dtype(record) else torch.float64
        exact = _run(record, load, cast, None)
    if len(exact) != len(outputs):
        raise NotReplayable(f"the replay returns {len(exact)} tensors, the dump {len(outputs)}")
    return outputs, recorded, exact


def _backward_exact(record: Record, fwd: Record, load: Load,
                    bounded: bool = False
                    ) -> tuple[list[int], dict[int, torch.Tensor], list[Optional[torch.dtype]],
                               list[Any], list[float]]:
    """The argument indices that got gradients, the recorded output gradients, the dtypes of
    the recorded input gradients, the float64 gradients and their slacks: 0, or with `bounded`
    a gradient `direct.backward_float32` gives within that L2 distance of float64 (a conv's
    weight gradient; `_exact_leaf` gives its float64 run when the bound cannot decide)."""
    grads_in = record["outputs"]
    leaves = [i for i, d in enumerate(grads_in) if isinstance(d, dict) and d.get("type") == "tensor"]
    if not leaves:
        raise NotReplayable("it has no gradient tensor to compare")
    grad_out = {j: d for j, d in enumerate(record["inputs"])
                if isinstance(d, dict) and d.get("type") == "tensor"}
    if not grad_out:
        raise NotReplayable("no gradient w.r.t. its outputs was recorded")
    g_plain = {j: _load_target(load, d, f"input {j}") for j, d in grad_out.items()}
    recorded = [_dtype(grads_in[i]) for i in leaves]
    with shielded():
        approx = (backward_float32(fwd, load, leaves, g_plain) if bounded else None) or {}
        rest = [i for i in leaves if i not in approx]
        found = dict(zip(rest, _exact_leaves(fwd, load, rest, g_plain, native=bounded))) \
            if rest else {}
    exact = [approx[i][0] if i in approx else found[i] for i in leaves]
    return leaves, g_plain, recorded, exact, [approx[i][1] if i in approx else 0.0 for i in leaves]


def _exact_leaves(fwd: Record, load: Load, leaves: list[int],
                  g_plain: dict[int, torch.Tensor], native: bool = False) -> list[Any]:
    """The float64 gradients of `leaves` (native: in the inputs' dtype where that is exact,
    as `_forward_exact`)."""
    if native and exact_in_dtype(fwd, g_plain):
        with shielded():
            return _run(fwd, load, None, None, leaves, g_plain)
    g_exact = {j: g.to(torch.float64) for j, g in g_plain.items()}
    with shielded():
        exact = backward_reference(fwd, load, leaves, g_exact, None, cast=torch.float64)
        if exact is None:
            exact = _run(fwd, load, torch.float64, None, leaves, g_exact)
    return exact


def _backward_reference(fwd: Record, load: Load, leaves: list[int],
                        g_plain: dict[int, torch.Tensor],
                        known: Optional[dict[str, Optional[torch.dtype]]]
                        ) -> tuple[Optional[torch.dtype], list[Any]]:
    """The reference kernel's gradients (and the autocast dtype that reproduces the forward).
    Once that dtype is known, an op `replay.direct` knows skips the forward run."""
    recorded = [_dtype(d) for _, r, d in iter_tensors(fwd) if r == "output"]
    for key in (fwd["name"], dtype_signature(fwd, recorded)):
        if known is not None and key in known:
            grads = backward_reference(fwd, load, leaves, g_plain, known[key])
            if grads is not None:
                return known[key], grads
            break
    else:
        # Not known yet (the forward settled without its reference): a conv finds it on one
        # sample (the first conv backward ran a bf16 forward of the whole batch, 400 ms, for it)
        low = sorted({d for d in recorded if d in _LOW}, key=str)
        found = sample_autocast(fwd, load, recorded, [None, *low])
        grads = backward_reference(fwd, load, leaves, g_plain, found[0]) if found else None
        if found and grads is not None:
            if known is not None:
                known[fwd["name"]] = known[dtype_signature(fwd, recorded)] = found[0]
            return found[0], grads
    return _reference(fwd, load, recorded, known, leaves, g_plain)
