"""Which process group a recorded collective ran on, and its place in that group's sequence.

Every rank issues the collectives of one group in the same order, so the k-th collective of
group [0, 1] on rank 0 is the k-th on rank 1: `"group": {"ranks": [0, 1], "seq": k}` on a
record finds the same collective in every participating rank's dump (the comparison's cross-rank
analysis reads it). Point-to-point ops (send/recv, isend/irecv) are counted per pair of peers
and also carry the peer: `{"ranks": [0, 1], "seq": k, "peer": 1}`.

    collectives.annotate(pending, func, args, kwargs, sink)    # capture/api.py, per Distributed op

The counter lives per sink (one per step and rank), and advances for collectives the selection
leaves out too, so numbering does not depend on what was recorded. Collectives issued inside
C++ (DDP's bucketed gradient all-reduce) never reach TorchFunctionMode and are not numbered.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable, Optional

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


__all__ = ["annotate", "group_of"]
