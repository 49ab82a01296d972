"""How one logical tensor is laid out over the ranks of a group: `Layout`.

    Layout.shard(1)      # each rank holds a slice along dim 1, in mesh-coordinate order
    Layout.partial()     # each rank holds a summand (a row-parallel output before all-reduce)
    Layout.REPLICATE     # each rank holds the whole tensor (a replica: checked against rank 0's)
    Layout.UNKNOWN       # nothing says: the merged tensor is not judged

`from_placement(desc)` reads capture's DTensor `placement` (`capture/collectives.local_shard`):
`{"placements": ["S(1)"], "coordinate": [0], "global_shape": [4, 16], "whole": false}`; torch
spells placements `S(1)`, `Shard(dim=1)`, `R`, `Replicate()`, `P(sum)`, `Partial(sum)`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ...store.schema import Descriptor
SHARD, PARTIAL, REPLICATE, UNKNOWN = "shard", "partial", "replicate", "unknown"

_SHARD = re.compile(r"^(?:S|Shard)\((?:dim=)?(-?\d+)\)$")
_PARTIAL = re.compile(r"^(?:P|Partial)\((?:reduce_op=)?'?(\w+)'?\)$")
_REPLICATE = ("R", "Replicate()")


@dataclass(frozen=True)
class Layout:
    kind: str
    dim: int = 0            # SHARD: the dim the pieces are joined along (non-negative)
    op: str = "sum"         # PARTIAL: how the summands combine ("avg": weighted by batch share)
    scaled: bool = False    # SHARD: each piece scaled by its rank's share of the batch (the
    #                         gradient of a data-parallel rank's mean loss, against the whole's)

    @staticmethod
    def shard(dim: int) -> "Layout":
        return Layout(SHARD, dim)

    @staticmethod
    def partial(op: str = "sum") -> "Layout":
        return Layout(PARTIAL, op=op)

    @property
    def text(self) -> str:
        """For people: "sharded along dim 1", "partial sums", "replicated", "unknown"."""
        if self.kind == SHARD:
            return f"sharded along dim {self.dim}" + (
                ", each piece scaled by its rank's share of the batch" if self.scaled else "")
        if self.kind == PARTIAL:
            return "partial sums" if self.op == "sum" else "partial means, weighted by batch share"
        return "replicated" if self.kind == REPLICATE else "laid out in a way nothing records"


Layout.REPLICATE = Layout(REPLICATE)      # type: ignore[attr-defined]
Layout.UNKNOWN = Layout(UNKNOWN)          # type: ignore[attr-defined]
REPLICATED: Layout = Layout(REPLICATE)
UNKNOWN_LAYOUT: Layout = Layout(UNKNOWN)


class Unsupported(Exception):
    """A layout this package cannot merge (a mesh of more than one dim, say): the side is
    compared rank by rank as before, and a note says why."""


def from_placement(desc: Descriptor) -> Optional[Layout]:
    """The layout a DTensor descriptor's `placement` names over a one-dim mesh; None when the
    descriptor has none; `Unsupported` for a mesh of more dims or a placement not known."""
    placed = desc.get("placement")
    if not isinstance(placed, dict):
        return None
    names = placed.get("placements")
    if not isinstance(names, list) or not names:
        return None
    if len(names) != 1:
        raise Unsupported(f"a device mesh of {len(names)} dims ({', '.join(map(str, names))})")
    name = str(names[0])
    if name in _REPLICATE:
        return REPLICATED
    m = _SHARD.match(name)
    if m:
        dim = int(m.group(1))
        ndim = len(desc.get("shape") or ())
        return Layout.shard(dim + ndim if dim < 0 else dim)
    m = _PARTIAL.match(name)
    if m:
        if m.group(1) not in ("sum", "avg"):
            raise Unsupported(f"partial placement {name}")
        return Layout.partial(m.group(1))
    raise Unsupported(f"placement {name}")


def coordinate(desc: Descriptor) -> Optional[int]:
    """This rank's place on the one-dim mesh, from its DTensor placement; None when unknown."""
    placed = desc.get("placement")
    coord = placed.get("coordinate") if isinstance(placed, dict) else None
    if isinstance(coord, list) and len(coord) == 1 and isinstance(coord[0], int):
        return coord[0]
    return None


__all__ = ["Layout", "SHARD", "PARTIAL", "REPLICATE", "UNKNOWN", "REPLICATED", "UNKNOWN_LAYOUT",
           "Unsupported", "from_placement", "coordinate"]
