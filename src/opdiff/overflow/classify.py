"""Is a tensor finite? Answered from a dump's descriptors, cheaply and without guessing.

Statistics say it directly (nan/inf counts, or a non-finite max/min in dumps that have no counts).
A descriptor without statistics but with a saved tensor is answered by loading that tensor. When
neither is there the answer is `Health(unknown=True)`, and callers decide what unknown means.
"""
from __future__ import annotations

import math

from ..dtypes import is_exact
from ..store.records import decoded_stats, iter_tensors
from ..store.schema import Descriptor, Kind, Record, Role
from .rules import FINITE, Health


def tensor_health(desc: Descriptor, dump=None) -> Health:
    """Health of one tensor descriptor; loads the saved tensor only when statistics are missing."""
    if is_exact(desc.get("dtype")):         # integers and bool cannot hold inf/NaN
        return FINITE
    stats = decoded_stats(desc)
    if stats:
        nan, inf = stats.get("nan"), stats.get("inf")
        if isinstance(nan, (int, float)) and isinstance(inf, (int, float)):
            return Health(nan=nan > 0, inf=inf > 0)
        # Foreign dumps without counts: a NaN anywhere makes max/min NaN, an inf makes one of them inf.
        extremes = [x for x in (stats.get("max"), stats.get("min")) if isinstance(x, (int, float))]
        if extremes:
            return Health(nan=any(math.isnan(x) for x in extremes),
                          inf=any(math.isinf(x) for x in extremes))
    if dump is not None and desc.get("key"):
        try:
            t = dump.tensor(desc["key"])
        except (OSError, ValueError):   # an unreadable file: that tensor's health is unknown
            t = None
        if t is not None:
            return _health_of(t)
    return Health(unknown=True)


def _health_of(t) -> Health:
    import torch

    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return FINITE
    return Health(nan=bool(torch.isnan(t).any()), inf=bool(torch.isinf(t).any()))


def sides(record: Record) -> tuple[list[Descriptor], list[Descriptor]]:
    """(input descriptors, output descriptors) of a record, as the op saw them.

    A module's parameters count as its inputs; a param_grad record's gradients are outputs.
    """
    ins, outs = [], []
    for _, role, desc in iter_tensors(record):
        if role == Role.OUTPUT or (role == Role.PARAMETERS and record["kind"] == Kind.PARAM_GRAD):
            outs.append(desc)
        else:
            ins.append(desc)
    return ins, outs


def health(descs: list[Descriptor], dump=None) -> Health:
    """Combined health of several tensor descriptors."""
    h = FINITE
    for d in descs:
        h = h | tensor_health(d, dump)
    return h


def max_abs(desc: Descriptor) -> float | None:
    """Largest magnitude of a tensor from its statistics (None without them, or when non-finite)."""
    stats = decoded_stats(desc)
    values = [abs(stats[k]) for k in ("max", "min") if isinstance(stats.get(k), (int, float))]
    if not values or not all(math.isfinite(v) for v in values):
        return None
    return max(values)
