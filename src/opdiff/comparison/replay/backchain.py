"""A backward region replayed as a vector-Jacobian product of its forward calls.

A backward region (`opdiff.comparison.regions`: SDPA's backward where golden runs eager
attention's matmul, softmax and matmul backwards) is judged on its own error the way a forward
region is (`replay.chain`), through its forward calls:

    from opdiff.comparison.replay.chain import Readers, replay_region
    local = replay_region("Region.2.backward", members, Readers(records), dump.tensor, policy)

- each backward record names its forward call (`"forward"`); the forward calls run as one chain
  in their execution order (`chainrun.run_chain`), fed by the dump's dataflow, with each tensor
  argument that comes from outside the region and that its backward record gives a gradient for
  made a leaf (one leaf per call and argument, so each gradient is the call's own, as capture
  records it: `capture/backward.py`);
- the region's outputs are the forward calls' outputs whose gradient arrives from outside the
  region: a backward record's input j is the gradient of its forward call's output tensor j;
  an output read both inside and outside the region is refused (the gradient from outside
  alone was not recorded);
- `torch.autograd.grad` of those outputs with the recorded gradients (`running.vjp`), in
  float64 and in the ops' own dtypes on the CPU, gives what a correct backward of the region
  makes for its inputs; the target's input gradients (a backward record's output i is the
  gradient of its forward call's tensor argument i) are judged against them by the rules a
  forward region's outputs are (`chainrun.judge_outputs`).

Anything missing (a forward call not in the dump, a forward input or a gradient not saved, an
op off the allow-list, checked for every forward call before any runs) leaves the region "not
replayed" with the reason; nothing is guessed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, TYPE_CHECKING, cast

import torch

from ...store.limits import TensorTooLarge
from ...store.records import iter_tensors
from ...store.schema import Phase, Record, Role
from .calls import NotReplayable
from .chainrun import Leaves, Readers, judge_outputs, output_slots, producer_of, refusal, run_chain
from .local import compute_dtype
from .rules import TensorLocalError
from .running import rng_guard, shielded, vjp
from .calls import Load

if TYPE_CHECKING:
    from ..verdicts import Policy



@dataclass
class _Plan:
    forwards: list[Record]                                  # in execution order
    roots: list[tuple[str, str]] = field(default_factory=list)   # (output name, its gradient's key)
    judged: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    # ^ backward output name -> (forward record name, argument index, key of the saved gradient)


def judge_backward(members: list[Record], readers: Readers, load: Load,
                   policy: "Policy", shortcut: bool) -> tuple[str, list[TensorLocalError]]:
    """The verdict on a backward region's input gradients (see the module docstring);
    NotReplayable with the reason where it cannot be replayed."""
    plan = _plan(members, readers)
    grads = [_saved(load, key, f"the gradient arriving at {n}") for n, key in plan.roots]
    targets = {n: _saved(load, key, n) for n, (_, _, key) in plan.judged.items()}
    exact, _ = _vjp(plan, load, torch.float64, [g.to(torch.float64) for g in grads])

    def reference() -> tuple[dict[str, torch.Tensor], list[Any]]:
        return _vjp(plan, load, None, grads)
    return judge_outputs(targets, exact, reference, policy,
                         compute_dtype(*members, *plan.forwards), shortcut)


def _plan(members: list[Record], readers: Readers) -> _Plan:
    """The forward chain, the region's outputs with their gradients, and the gradients judged;
    everything checked before any op runs."""
    if not members:
        raise NotReplayable("it has no target op")
    pairs: list[tuple[Record, Record]] = []
    for b in members:
        link = b.get("forward")
        f = readers.by_name.get(link) if isinstance(link, str) else None
        if f is None:
            raise NotReplayable(f"{b['name']} names no forward call in the dump (its forward "
                                f"inputs are needed to differentiate it)")
        if f["phase"] != Phase.FORWARD or f["op"] != b["op"] or f["kind"] != b["kind"]:
            raise NotReplayable(f"{b['name']} names {f['name']} as its forward call, which is "
                                f"not a forward call of the same op")
        if any(f is other for _, other in pairs):
            raise NotReplayable(f"two backward records name the forward call {f['name']}")
        pairs.append((b, f))
    refused = refusal([f for _, f in pairs])     # (the allow-list, for every call that runs)
    if refused:
        raise NotReplayable(refused)
    pairs.sort(key=lambda p: cast(int, p[1]["seq"]))   # (a record without one: TypeError)
    plan = _Plan([f for _, f in pairs])
    inside_seqs = {f["seq"] for f in plan.forwards}
    inside = {f["name"] for f in plan.forwards}
    for b, f in pairs:
        _roots(plan, b, f, readers, inside)
        _judged(plan, b, f, inside_seqs)
    if not plan.roots:
        raise NotReplayable("no gradient arriving at the region's outputs was recorded")
    if not plan.judged:
        raise NotReplayable("its backward records hold no gradient for the region's inputs")
    return plan


def _roots(plan: _Plan, b: Record, f: Record, readers: Readers, inside: set[str]) -> None:
    """The outputs of `f` whose gradient arrives from outside the region (`b`'s inputs)."""
    slots = output_slots(f)
    arriving = b["inputs"]
    if len(arriving) > len(slots):
        raise NotReplayable(f"{b['name']} has {len(arriving)} output gradients, its forward "
                            f"call {len(slots)} outputs")
    for (n, slot), g in zip(slots, arriving):
        if not _is_tensor(g):
            continue
        read = readers.read_by(f, slot)
        if any(r in inside for r in read):
            if any(r not in inside for r in read):
                raise NotReplayable(f"{n} is read inside the region and outside it: the "
                                    f"gradient arriving from outside alone was not recorded")
            continue        # made and used inside: its gradient is the chain's own
        if not g.get("key"):
            raise NotReplayable(f"the gradient arriving at {n} was not saved")
        plan.roots.append((n, str(g["key"])))


def _judged(plan: _Plan, b: Record, f: Record, inside_seqs: set[Optional[int]]) -> None:
    """The gradients `b` recorded for the arguments of `f` that come from outside the region."""
    args = [(n, d) for n, role, d in iter_tensors(f) if role == Role.INPUT]
    sent = b["outputs"]
    if len(sent) > len(args):
        raise NotReplayable(f"{b['name']} has {len(sent)} input gradients, its forward call "
                            f"{len(args)} tensor arguments")
    keys = [d.get("key") for _, d in args]
    for i, ((n, d), g) in enumerate(zip(args, sent)):
        producer = producer_of(d)
        if (producer is not None and producer[0] in inside_seqs) or not _is_tensor(g):
            continue
        if not d.get("key"):
            raise NotReplayable(f"{n}, an input of the region, was not saved")
        if keys.count(d["key"]) > 1:
            raise NotReplayable(f"{f['name']} reads one saved tensor twice ({n}): its gradient "
                                f"is not recorded per argument")
        if not g.get("key"):
            raise NotReplayable(f"the gradient {b['name']}.output.{i} was not saved")
        plan.judged[f"{b['name']}.output.{i}"] = (f["name"], i, str(g["key"]))


def _vjp(plan: _Plan, load: Load, cast: Optional[torch.dtype],
         grads: list[torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """The gradients of the region's inputs (by the judged names) from the forward chain run in
    float64 (cast) or its own dtypes (None), and the autocast each call ran under."""
    want: dict[str, set[int]] = {}
    for f_name, i, _ in plan.judged.values():
        want.setdefault(f_name, set()).add(i)
    leaves = Leaves(want)
    values, autocast = run_chain(plan.forwards, load, cast, [n for n, _ in plan.roots], leaves)
    pairs = [(values[n], g) for (n, _), g in zip(plan.roots, grads) if values[n].requires_grad]
    if not pairs:
        raise NotReplayable("the region's replayed outputs do not depend on its inputs")
    slots = [(f_name, i) for f_name, i, _ in plan.judged.values()]
    for name, slot in zip(plan.judged, slots):
        if slot not in leaves.made:
            raise NotReplayable(f"{name}: its argument is not a floating tensor to "
                                f"differentiate")
    with shielded(), rng_guard() as rng:
        got = vjp(pairs, [leaves.made[s] for s in slots])
    if rng["consumed"]:
        raise NotReplayable("its backward draws random numbers (a new draw would not match "
                            "the target's)")
    return {name: (g if g is not None else torch.zeros_like(leaves.made[s])).detach()
            for name, s, g in zip(plan.judged, slots, got)}, autocast


def _is_tensor(desc: Any) -> bool:
    return isinstance(desc, dict) and desc.get("type") == "tensor"


def _saved(load: Load, key: str, what: str) -> torch.Tensor:
    try:
        t = load(key)
    except TensorTooLarge as exc:
        raise NotReplayable(str(exc)) from None
    if not isinstance(t, torch.Tensor):
        raise NotReplayable(f"{what} was not saved")
    return t


__all__ = ["judge_backward"]
