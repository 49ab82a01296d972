"""Running a chain of recorded ops: each op fed by the ops before it, through the dump's dataflow.

Shared by a forward region's replay (`replay.chain`) and a backward region's
(`replay.backchain`, which runs the chain with gradients on and differentiates it):

    from opdiff.comparison.replay.chainrun import Readers, refusal, run_chain
    why = refusal(members)                      # before anything runs: a dump is untrusted
    values, autocast = run_chain(members, load, torch.float64, wanted)

- an op's tensor input comes from the chain (its producer, `"producer": [seq, slot]` on its
  descriptor, is an earlier op of the chain) or is the tensor the dump saved for it; an input
  that can be neither raises `NotReplayable` with the reason, nothing is guessed;
- each op runs through `calls.rebuild_call` (the allow-list, the arguments, --max-tensor-mb),
  out of sight of the user's TorchFunctionModes, with the CPU generator guarded (an op that
  draws is refused), in float64 or in its own dtypes under the CPU autocast that reproduces its
  recorded output dtypes;
- with `grads` (a `Leaves`), the chain runs with autograd on and the argument slots it names
  become leaves: one leaf per op and slot, so each op's gradient for each argument is its own,
  as the target's backward records hold them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ... import ops
from ...store.records import iter_tensors, producer_of
from ...store.schema import Kind, Record, Role
from .calls import NotReplayable, flat_tensors, rebuild_call
from .kernels import program_refusal, run_program
from .rules import TensorLocalError, judge_tensor, settle
from .running import autocast_to, rng_guard, shielded
from .calls import Load

if TYPE_CHECKING:
    from ..verdicts import Policy

_LOW = (torch.bfloat16, torch.float16)


class Readers:
    """Who reads which recorded tensor, through the dump's dataflow: built once per dump.
    Module records, which only pass tensors on, are not readers. `by_name` finds a backward
    record's forward call."""

    def __init__(self, records: list[Record]) -> None:
        self.by_producer: dict[tuple[Any, str], list[str]] = {}
        self.by_name: dict[str, Record] = {}
        for rec in records:
            self.by_name[rec["name"]] = rec
            if rec["kind"] == Kind.MODULE:
                continue
            for _, role, desc in iter_tensors(rec):
                producer = producer_of(desc) if role == Role.INPUT else None
                if producer is not None:
                    self.by_producer.setdefault(producer, []).append(rec["name"])

    def outputs(self, members: list[Record]) -> list[str]:
        """The tensors the region's ops made that a recorded op outside it reads; without
        any, its last op's outputs."""
        inside = {m["name"] for m in members}
        found = []
        for m in members:
            for n, slot in output_slots(m):
                readers = self.by_producer.get((m["seq"], slot))
                if readers and any(r not in inside for r in readers):
                    found.append(n)
        return found or [n for n, _ in output_slots(members[-1])]

    def read_by(self, rec: Record, slot: str) -> list[str]:
        """The records that read output `slot` of `rec` (by the dataflow)."""
        return self.by_producer.get((rec["seq"], slot), [])


def output_slots(rec: Record) -> list[tuple[str, str]]:
    """(tensor name, slot) of each output tensor of a record, in the capture's order: slot "0",
    or "0.1" in a nested output, as a producer names it."""
    cut = len(rec["name"]) + len(".output.")
    return [(n, n[cut:]) for n, role, _ in iter_tensors(rec) if role == Role.OUTPUT]


def refusal(members: list[Record]) -> Optional[str]:
    """Why a chain of these records must not run at all (checked before any op runs), or None."""
    if not members:
        return "it has no target op"
    for rec in members:
        if not isinstance(rec["seq"], int) or isinstance(rec["seq"], bool):
            return f"{rec['name']} has no sequence number for the dataflow to name it by"
        if rec["kind"] == Kind.KERNEL:     # (its stored program: the aten ops it fuses)
            why = program_refusal(rec)
            if why:
                return f"{rec['name']} is a compiled kernel, whose program replay cannot run: {why}"
            continue
        if rec["kind"] not in Kind.REPLAYABLE:
            return f"{rec['name']} is a {rec['kind']} record, made of other ops"
        refused = ops.replay_refusal(str(rec["op"]))
        if refused:
            return f"{rec['name']}: {refused}"
    return None


@dataclass
class Leaves:
    """What a chain run differentiates: `want` {record name: argument indices, in the capture's
    order (`Call.tensors`)} become leaves; the run fills `made` {(record name, index): leaf}."""
    want: dict[str, set[int]]
    made: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)


def run_chain(members: list[Record], load: Load, cast: Optional[torch.dtype],
              wanted: list[str], grads: Optional[Leaves] = None
              ) -> tuple[dict[str, torch.Tensor], list[Optional[torch.dtype]]]:
    """Run the members in order (cast: float64, or None for their own dtypes); returns the
    tensors named in `wanted` and the autocast each op ran under. Each value is dropped once
    the last op reading it has run. With `grads`, autograd records the chain (the values keep
    their graph) and `grads.made` gets the leaves."""
    seqs = {m["seq"]: m for m in members}
    last_use: dict[str, int] = {}
    for i, rec in enumerate(members):
        for _, role, desc in iter_tensors(rec):
            producer = producer_of(desc) if role == Role.INPUT else None
            if producer is not None and producer[0] in seqs:
                last_use[f"{seqs[producer[0]]['name']}.output.{producer[1]}"] = i
    values: dict[str, torch.Tensor] = {}
    used: list[Optional[torch.dtype]] = []
    for i, rec in enumerate(members):
        kernel = rec["kind"] == Kind.KERNEL
        chain_load = _loader(_fed(rec, seqs, values, kernel), load)
        if kernel:
            _kernel(rec, chain_load, cast, grads is not None, values)
            used.append(None)
        else:
            want = grads.want.get(rec["name"], set()) if grads is not None else None
            outs, autocast, leaves = _run(rec, chain_load, cast, want)
            if grads is not None:
                grads.made.update({(rec["name"], k): leaf for k, leaf in leaves.items()})
            used.append(autocast)
            _keep(rec, outs, values, grads is not None)
        for n in [n for n, at in last_use.items() if at == i and n not in wanted]:
            values.pop(n, None)
    missing = [n for n in wanted if n not in values]
    if missing:     # (an output its kernel's program does not name: _kernel)
        raise NotReplayable(f"{missing[0]} is a result of its kernel that the kernel's recorded "
                            f"program does not compute (an Inductor buffer), so the chain "
                            f"cannot make it")
    return {n: values[n] for n in wanted}, used


def _keep(rec: Record, outs: list[torch.Tensor], values: dict[str, torch.Tensor],
          graph: bool) -> None:
    """An op's replayed outputs into `values`, checked against the dump's count and shapes."""
    names = [n for n, _ in output_slots(rec)]
    shapes = [d.get("shape") for _, role, d in iter_tensors(rec) if role == Role.OUTPUT]
    if len(outs) != len(names):
        raise NotReplayable(f"{rec['name']}: the replay returns {len(outs)} tensors, the "
                            f"dump {len(names)}")
    for n, out, shape in zip(names, outs, shapes):
        if shape is not None and list(out.shape) != list(shape):
            raise NotReplayable(f"{n}: replayed shape {list(out.shape)}, dump {shape}")
        values[n] = out if graph else out.detach()


def _kernel(rec: Record, load: Load, cast: Optional[torch.dtype],
            backward: bool, values: dict[str, torch.Tensor]) -> None:
    """A compiled kernel of the chain, run as its stored program (replay/kernels.py): the
    outputs it names join `values`; one it does not name (Inductor's internal buffers) is
    absent, and an op or region output reading it makes the chain say so."""
    if backward:
        raise NotReplayable(f"{rec['name']} is a compiled kernel, replayed forward only")
    shapes = [d.get("shape") for _, role, d in iter_tensors(rec) if role == Role.OUTPUT]
    names = [n for n, _ in output_slots(rec)]
    for o, out in run_program(rec, load, cast).items():
        shape = shapes[o]
        if isinstance(shape, list) and list(out.shape) != shape:
            raise NotReplayable(f"{names[o]}: replayed shape {list(out.shape)}, dump {shape}")
        values[names[o]] = out.detach()


def _fed(rec: Record, seqs: dict[Optional[int], Record], values: dict[str, torch.Tensor],
         kernel: bool = False) -> dict[str, torch.Tensor]:
    """{saved key: chain value} for the record's inputs made by earlier ops of the chain;
    NotReplayable where an input is neither made there nor saved (a kernel's: where its
    program reads it, replay/kernels.py says so; an `out=` buffer it only writes is not)."""
    fed: dict[str, torch.Tensor] = {}
    for n, role, desc in iter_tensors(rec):
        if role == Role.OUTPUT:
            continue
        producer, key = producer_of(desc), desc.get("key")
        if producer is not None and producer[0] in seqs:
            made = f"{seqs[producer[0]]['name']}.output.{producer[1]}"
            if made not in values:
                raise NotReplayable(f"{n} is read from {made}, which the chain has not made")
            if not key:
                raise NotReplayable(f"{n} has no tensor key to feed the chain's value by")
            if key in fed and fed[key] is not values[made]:
                raise NotReplayable(f"{n}: one saved tensor stands for two chain values")
            fed[key] = values[made]
        elif not key and not kernel:
            raise NotReplayable(f"{n} is neither a saved input of the region nor made by an "
                                f"earlier op of it")
        elif key in fed:
            raise NotReplayable(f"{n}: one saved tensor stands for a chain value and a saved one")
    return fed


def _loader(fed: dict[str, torch.Tensor], load: Load) -> Load:
    def chain_load(key: str) -> Any:
        return fed[key] if key in fed else load(key)
    return chain_load


def _run(rec: Record, load: Load, cast: Optional[torch.dtype],
         want: Optional[set[int]]
         ) -> tuple[list[torch.Tensor], Optional[torch.dtype], dict[int, torch.Tensor]]:
    """One op of the chain: in float64 (autocast off), or in its own dtypes under the CPU
    autocast that reproduces its recorded output dtypes (None first, then its low dtypes)."""
    recorded = [str(d.get("dtype", "")).replace("torch.", "")
                for _, role, d in iter_tensors(rec) if role == Role.OUTPUT]
    if cast is not None:
        outs, leaves = _call(rec, load, cast, None, want)
        return outs, None, leaves
    low = sorted({d for d in _LOW if str(d).replace("torch.", "") in recorded}, key=str)
    candidates: list[Optional[torch.dtype]] = [None, *low]
    for at, autocast in enumerate(candidates):
        try:
            outs, leaves = _call(rec, load, None, autocast, want)
        except NotReplayable:
            raise
        except Exception:
            if at + 1 == len(candidates):
                raise
            continue
        if [str(o.dtype).replace("torch.", "") for o in outs] == recorded:
            return outs, autocast, leaves
    raise NotReplayable(f"{rec['name']}: the CPU kernel does not reproduce the target's output "
                        f"dtypes ({', '.join(recorded)})")


def _call(rec: Record, load: Load, cast: Optional[torch.dtype],
          autocast: Optional[torch.dtype], want: Optional[set[int]]
          ) -> tuple[list[torch.Tensor], dict[int, torch.Tensor]]:
    """Run one record's call; with `want` (None: no autograd), under autograd with those
    argument indices made leaves ({index: leaf})."""
    by_key: dict[str, torch.Tensor] = {}
    keys = [str(d.get("key") or "") for _, role, d in iter_tensors(rec) if role == Role.INPUT]
    leaf_keys = {keys[i] for i in (want or ()) if i < len(keys) and keys[i]}

    def leaf(key: str, t: torch.Tensor) -> torch.Tensor:
        # the leaf gets the gradient; the call a copy of it (an in-place op may write there)
        if key in leaf_keys and (t.is_floating_point() or t.is_complex()):
            by_key[key] = t.detach().requires_grad_(True)
            return by_key[key].clone()
        return t

    call = rebuild_call(rec, load, cast, wrap=leaf if leaf_keys else None)   # (allow-list,
    with shielded(), rng_guard() as rng, autocast_to(autocast), \
            torch.set_grad_enabled(want is not None):                      # --max-tensor-mb)
        out = call.run()
    if rng["consumed"]:
        raise NotReplayable(f"{rec['name']} draws random numbers (a new draw would not match "
                            f"the target's)")
    if out is None and ops.traits(str(rec["op"])).returns_first_argument and call.args:
        out = call.args[0]
    leaves = {i: by_key[call.tensors[i][0]] for i in sorted(want or ())
              if i < len(call.tensors) and call.tensors[i][0] in by_key}
    return flat_tensors([out] if not isinstance(out, (tuple, list)) else out), leaves


def judge_outputs(targets: dict[str, torch.Tensor], exact: dict[str, torch.Tensor],
                  reference: Callable[[], tuple[dict[str, torch.Tensor], list[Any]]],
                  policy: "Policy", low: Optional[str], shortcut: bool
                  ) -> tuple[str, list[TensorLocalError]]:
    """The verdict on what the target saved ({name: tensor}) against the float64 chain's
    `exact`, as one replayed op's (`rules.settle`; where that cannot decide, `judge_tensor`
    against `reference()`: the own-dtype chain's tensors and the autocast each op ran under).
    Returns (what the reference is, in words; one verdict per tensor)."""
    for n, t in targets.items():
        if tuple(t.shape) != tuple(exact[n].shape):
            raise NotReplayable(f"{n}: replayed shape {list(exact[n].shape)}, saved "
                                f"{list(t.shape)}")
    settled = [settle(n, t, exact[n], policy, compute=low) if shortcut else None
               for n, t in targets.items()]
    if all(s is not None for s in settled):
        return f"rounding to {low}" if low else "exact result", [
            s for s in settled if s is not None]
    ref, autocast = reference()
    for n, t in targets.items():
        if ref[n].dtype != t.dtype:
            raise NotReplayable(f"{n}: the CPU chain in its own dtypes gives {ref[n].dtype}, "
                                f"the dump {t.dtype}")
    kinds = sorted({str(d).replace("torch.", "") for d in autocast if d is not None})
    name = (low or "exact dtypes") + (f", under autocast to {', '.join(kinds)}" if kinds else "")
    return name, [s if s is not None else judge_tensor(n, t, exact[n], ref[n], policy, low)
                  for s, (n, t) in zip(settled, targets.items())]


__all__ = ["Leaves", "judge_outputs", "Readers", "output_slots", "producer_of", "refusal", "run_chain"]
