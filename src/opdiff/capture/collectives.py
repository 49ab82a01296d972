"""Which process group a recorded collective ran on, and its place in that group's sequence.

Every rank issues the collectives of one group in the same order, so the k-th collective of
group [0, 1] on rank 0 is the k-th on rank 1: `"group": {"ranks": [0, 1], "seq": k}` on a
record finds the same collective in every participating rank's dump (the comparison's cross-rank
analysis reads it). Point-to-point ops (send/recv, isend/irecv) are counted per pair of peers
and also carry the peer: `{"ranks": [0, 1], "seq": k, "peer": 1}`.

    collectives.annotate(pending, func, args, kwargs, sink)    # capture/api.py, per Distributed op

The counter lives per sink (one per step and rank), and advances for collectives the selection
leaves out too, so numbering does not depend on what was recorded.

DDP's bucketed gradient all-reduce is issued by its C++ reducer inside backward, where no
TorchFunctionMode is active (the mode stack is empty in the reducer's hook) and where L1 records
no op call anyway: it is invisible by default. `record_ddp_allreduce(ddp_model)` opts in: it
registers a DDP comm hook doing what DDP's default does (divide by the group size, all_reduce),
issued through `dist.all_reduce` with the running capture's mode re-entered, so the bucket's
all_reduce becomes a `Distributed.all_reduce` record with its group and number like any other.
It needs capture/api.py's side: the running ApiCapture registers itself here (`entered`/`left`)
and lets a collective through during backward when `in_comm_hook(op)`; it sets
`BACKWARD_COLLECTIVES` to say it does.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from typing import Any, Callable, Optional

from ..errors import ConfigError

_P2P_PEER = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}
_signatures: dict[Callable[..., Any], Optional[inspect.Signature]] = {}
_counters: "weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], int]]" = \
    weakref.WeakKeyDictionary()


def _signature(func: Callable[..., Any]) -> Optional[inspect.Signature]:
    if func not in _signatures:
        try:
            _signatures[func] = inspect.signature(func)
        except (TypeError, ValueError):
            _signatures[func] = None
    return _signatures[func]


def group_of(func: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Optional[tuple[list[int], Optional[int]]]:
    """(the global ranks of the call's process group, the peer of a point-to-point op), or None
    when torch.distributed is not initialised or the call names no group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    sig = _signature(func)
    if sig is None:
        return None
    try:
        bound = sig.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return None
    group = bound.get("group")
    if group is None:
        group = bound.get("process_group")
    try:
        ranks = sorted(dist.get_process_group_ranks(group or dist.group.WORLD))
    except Exception:  # noqa: BLE001 - a group torch cannot describe: not numbered
        return None
    peer_arg = _P2P_PEER.get(getattr(func, "__name__", ""))
    peer = bound.get(peer_arg) if peer_arg else None
    return ranks, (int(peer) if peer is not None else None)


def annotate(pending: Any, func: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], sink: Any) -> None:
    """Number this collective in its group's sequence (always) and, when it is recorded
    (`pending` not None), set `pending.record["group"]`. Never raises into the user's call."""
    try:
        found = group_of(func, args, kwargs)
        if found is None:
            return
        ranks, peer = found
        if peer is not None:
            import torch.distributed as dist

            me = dist.get_rank()
            key: tuple[Any, ...] = ("p2p", min(me, peer), max(me, peer))
        else:
            key = tuple(ranks)
        counters = _counters.setdefault(sink, {})
        seq = counters.get(key, 0)
        counters[key] = seq + 1
        if pending is not None:
            group: dict[str, Any] = {"ranks": ranks, "seq": seq}
            if peer is not None:
                group["peer"] = peer
            pending.record["group"] = group
    except Exception:  # noqa: BLE001 - bookkeeping must not break the user's collective
        return


# capture/api.py sets this when it records the collectives `record_ddp_allreduce`'s hook issues.
BACKWARD_COLLECTIVES = False
_active_modes: list[Any] = []        # the running capture modes, innermost last
_hook_state = threading.local()


def entered(mode: Any) -> None:
    """A capture mode started (capture/api.py): the comm hook re-enters the innermost one."""
    _active_modes.append(mode)


def left(mode: Any) -> None:
    """A capture mode stopped."""
    if mode in _active_modes:
        _active_modes.remove(mode)


def in_comm_hook(op: str) -> bool:
    """Whether `op` is a collective issued by `record_ddp_allreduce`'s hook: capture records it
    although autograd's engine is running a node."""
    return bool(getattr(_hook_state, "on", False)) and op.startswith("Distributed.")


def record_ddp_allreduce(ddp_model: Any, process_group: Any = None) -> None:
    """Opt in to recording DDP's gradient all-reduce (one `Distributed.all_reduce` record per
    bucket, with its group and per-group number) while opdiff captures at L1.

    Call it once after wrapping the model, before training: it registers a DDP comm hook
    (`register_comm_hook`) with DDP's default arithmetic (`allreduce_hook`: the bucket divided
    by the group size, then summed over the group), so training is unchanged; a model that has
    its own comm hook already cannot take a second one (DDP raises). A ConfigError when this
    opdiff's capture cannot record collectives issued inside backward.
    """
    from . import api  # noqa: F401 - the capture says whether it lets the hook's collective through

    if not BACKWARD_COLLECTIVES:
        raise ConfigError("this opdiff's capture does not record collectives issued inside "
                          "backward, so DDP's bucket all-reduce cannot be recorded; the gradients "
                          "it carries are compared as usual, without the collective")
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state: Any, bucket: Any) -> Any:
        mode = _active_modes[-1] if _active_modes else None
        _hook_state.on = True
        try:
            with mode if mode is not None else contextlib.nullcontext():
                return default_hooks.allreduce_hook(state, bucket)
        finally:
            _hook_state.on = False

    # DDP checks the hook's annotations as objects (this module's are strings).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    ddp_model.register_comm_hook(process_group, hook)


__all__ = ["annotate", "group_of", "record_ddp_allreduce", "in_comm_hook", "entered", "left",
           "BACKWARD_COLLECTIVES"]
