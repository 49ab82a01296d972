"""The raw tensors of a replayed record, for `opdiff check`: the float64 result, the CPU reference
kernel's and the target's, with no judgement (the check's standards judge them).

    from opdiff.comparison.replay.tensors import replay_tensors
    rep = replay_tensors(record, dump.tensor, forward_record=None, device=None)
    rep.reference, rep.outputs      # [(name, target, float64 result, reference result)]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .calls import NotReplayable
from .local import (_backward_exact, _backward_reference, _forward_exact, _load_target,
                    _reference, _reference_name, _run, one_thread)
from .running import shielded
from .calls import Load
from ...store.schema import Record


@dataclass(frozen=True)
class Replayed:
    """The raw tensors of one replayed record, before any judgement: per compared output,
    (tensor name, target, float64 result, reference kernel's result); `reference` names the
    reference kernel ("bfloat16 CPU kernel (autocast)")."""
    reference: str
    outputs: tuple[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor], ...]


def replay_tensors(record: Record, load: Load,
                   forward_record: Optional[Record] = None,
                   device: Optional[str] = None,
                   known: Optional[dict[str, Optional[torch.dtype]]] = None) -> Replayed:
    """Re-run one record in float64 and as the CPU reference kernel and return the tensors.

    The target is the recorded output (gradient), or, with `device`, the same call re-run on
    that device in the recorded dtypes on the same inputs (statistics dumps: `load` then
    makes up the inputs). The float64 and reference runs are shielded from the user's
    TorchFunctionModes (a test's planted fault), the device run is not. `known`: a dict kept
    across calls, {record name: the CPU autocast dtype (or None) that reproduces its dtypes},
    which saves the reference forward run of a backward record whose forward was replayed.
    Raises NotReplayable with the reason."""
    with one_thread():
        if record["phase"] == "backward" and record["kind"] != "aten":
            if forward_record is None:
                raise NotReplayable("its forward call is not in the dump")
            return _backward_tensors(record, forward_record, load, device, known)
        return _forward_tensors(record, load, device, known)


def _device_load(load: Load, device: str) -> Load:
    def on_device(key: str) -> Any:
        t = load(key)
        return t.to(device) if isinstance(t, torch.Tensor) else t
    return on_device


def _forward_tensors(record: Record, load: Load,
                     device: Optional[str],
                     known: Optional[dict[str, Optional[torch.dtype]]] = None) -> Replayed:
    outputs, recorded, exact = _forward_exact(record, load)
    with shielded():
        autocast, reference = _reference(record, load, recorded, known)
    targets: list[Optional[torch.Tensor]]
    if device is not None:
        targets = [o.cpu() for o in _run(record, _device_load(load, device), None, autocast,
                                         device=device)]
    else:
        targets = [_load_target(load, d, name) for name, d in outputs]
    out = []
    for (name, _d), e, r, t in zip(outputs, exact, reference, targets):
        if t is None or tuple(t.shape) != tuple(e.shape):
            raise NotReplayable(f"{name}: replayed shape {list(e.shape)}, dump "
                                f"{list(t.shape) if t is not None else None}")
        out.append((name, t, e, r))
    return Replayed(_reference_name(recorded, autocast), tuple(out))


def _backward_tensors(record: Record, fwd: Record, load: Load,
                      device: Optional[str],
                      known: Optional[dict[str, Optional[torch.dtype]]] = None) -> Replayed:
    leaves, g_plain, recorded, exact, _ = _backward_exact(record, fwd, load)
    grads_in = record["outputs"]
    with shielded():
        autocast, reference = _backward_reference(fwd, load, leaves, g_plain, known)
    targets: list[Optional[torch.Tensor]]
    if device is not None:
        g_dev = {j: g.to(device) for j, g in g_plain.items()}
        targets = [g.cpu() if g is not None else None for g in
                   _run(fwd, _device_load(load, device), None, autocast, leaves, g_dev,
                        device=device)]
    else:
        targets = [_load_target(load, grads_in[i], f"{record['name']}.output.{i}")
                   for i in leaves]
    out = []
    for i, e, r, t in zip(leaves, exact, reference, targets):
        name = f"{record['name']}.output.{i}"
        if e is None or r is None or t is None:
            raise NotReplayable(f"{name}: the forward call has no such tensor argument")
        if tuple(t.shape) != tuple(e.shape) or t.dtype != r.dtype:
            raise NotReplayable(f"{name}: replayed {r.dtype} {list(e.shape)}, "
                                f"dump {t.dtype} {list(t.shape)}")
        out.append((name, t, e, r))
    return Replayed(_reference_name(recorded, autocast), tuple(out))


__all__ = ["Replayed", "replay_tensors"]
