"""Is a tensor finite? Answered from a dump's descriptors, cheaply and without guessing.

Statistics say it directly (nan/inf counts, or a non-finite max/min in dumps that have no counts).
A descriptor without statistics but with a saved tensor is answered by loading that tensor. When
neither is there the answer is `None` (unknown), and callers decide what unknown means.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..store.records import decoded_stats, has_nonfinite_number, iter_tensors

_EXACT = ("int", "bool", "uint")      # dtypes that cannot hold inf/NaN


@dataclass(frozen=True)
class Health:
    """What the tensors on one side of an op (its inputs, or its outputs) hold."""

    nan: bool = False           # some tensor holds NaN
    inf: bool = False           # some tensor holds +-inf
    unknown: bool = False       # some floating tensor could not be checked

    @property
    def finite(self) -> bool:
        return not (self.nan or self.inf)

    def __or__(self, other: "Health") -> "Health":
        return Health(self.nan or other.nan, self.inf or other.inf, self.unknown or other.unknown)


CLEAN = Health()


def tensor_health(desc: dict, dump=None) -> Health:
    """Health of one tensor descriptor; loads the saved tensor only when statistics are missing."""
    dtype = str(desc.get("dtype") or "")
    if dtype.startswith(_EXACT):
        return CLEAN
    stats = decoded_stats(desc)
    if stats:
        nan, inf = stats.get("nan"), stats.get("inf")
        if isinstance(nan, (int, float)) and isinstance(inf, (int, float)):
            return Health(nan=nan > 0, inf=inf > 0)
        # Foreign dumps without counts: a NaN anywhere makes max/min NaN, an inf makes one of them inf.
        extremes = [stats.get(k) for k in ("max", "min") if isinstance(stats.get(k), (int, float))]
        if extremes:
            return Health(nan=any(math.isnan(x) for x in extremes),
                          inf=any(math.isinf(x) for x in extremes))
    if dump is not None and desc.get("key"):
        t = dump.tensor(desc["key"])
        if t is not None:
            return _health_of(t)
    return Health(unknown=True)


def _health_of(t) -> Health:
    import torch

    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return CLEAN
    return Health(nan=bool(torch.isnan(t).any()), inf=bool(torch.isinf(t).any()))


def sides(record: dict) -> tuple[list[dict], list[dict]]:
    """(input descriptors, output descriptors) of a record, as the op saw them.

    A module's parameters count as its inputs; a param_grad record's gradients are outputs.
    """
    ins, outs = [], []
    for _, role, desc in iter_tensors(record):
        if role == "output" or (role == "parameters" and record.get("kind") == "param_grad"):
            outs.append(desc)
        else:
            ins.append(desc)
    return ins, outs


def health(descs: list[dict], dump=None) -> Health:
    """Combined health of several tensor descriptors."""
    h = CLEAN
    for d in descs:
        h = h | tensor_health(d, dump)
    return h


def max_abs(desc: dict) -> float | None:
    """Largest magnitude of a tensor from its statistics (None without them, or when non-finite)."""
    stats = decoded_stats(desc)
    values = [abs(stats[k]) for k in ("max", "min") if isinstance(stats.get(k), (int, float))]
    if not values or not all(math.isfinite(v) for v in values):
        return None
    return max(values)
