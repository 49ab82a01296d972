"""Cutting one side's activation down to the real tokens of the matched sequences.

Which dims hold rows and positions is read from the tensor's own recorded shape against its
side's layout (no model-specific code): dim 0 is the batch where it has the side's batch size,
serves every row where it is 1, or holds (row, position) merged where it is batch x length; every
other dim of the side's length is a token dim (a query's, a key's). A dim is cut only where the
same-named tensor of the other side agrees (`agrees`): there its size is that side's batch or
length too, so a head or hidden size that happens to equal the length is never cut::

    cut = cut_for([2, 12, 32], target_layout)          # Cut(lead="row", tokens=(1,))
    part = cut.apply(tensor, [match.target for match in matches], target_layout)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence as Seq

from ...store.schema import Statistics
from .sequences import Layout, Sequence

if TYPE_CHECKING:
    import torch

ROW, BROADCAST, FLAT = "row", "broadcast", "flat"


@dataclass(frozen=True)
class Cut:
    """How a tensor is cut: its dim 0 (`lead`: ROW, BROADCAST, FLAT or "") and its token dims."""

    lead: str
    tokens: tuple[int, ...]
    # (dim, a, b): that dim keeps the sequence's positions[a:b] (a pass of a decode: its own
    # tokens for a query's dim, every token so far for a key's); the other token dims keep all
    windows: tuple[tuple[int, int, int], ...] = ()
    # added to the values: a decode step's positions counted from its own start (an `arange`
    # of its tokens) counted from the sequence's start instead, as one forward counts them
    offset: int = 0

    def shape(self, shape: Seq[int], sequences: Seq[Sequence]) -> list[int]:
        """The shape `apply` gives a tensor of `shape` (for the records, without loading it)."""
        parts = [self._part_shape(list(shape), s) for s in sequences]
        return _joined_shape(parts, self.lead)

    def _part_shape(self, shape: list[int], s: Sequence) -> list[int]:
        if self.lead == FLAT:
            return [len(s.positions), *shape[1:]]
        out = list(shape)
        if self.lead == ROW:
            out[0] = 1
        for d in self.tokens:
            out[d] = len(s.positions)
        for d, a, b in self.windows:
            out[d] = b - a
        return out

    def apply(self, tensor: "torch.Tensor", sequences: Seq[Sequence], layout: Layout) -> "torch.Tensor":
        """The tensor's values at the sequences' rows and real positions, sequences in order
        (joined along dim 0 where their parts have one shape, else flattened one after another).
        A row index (an integer tensor along the batch holding 0..batch-1) becomes the
        sequences' own numbers: which row a sequence sat in is layout, not computation."""
        import torch

        if self.offset:
            return tensor + self.offset
        if self.lead == ROW and _row_index(tensor, layout.batch):
            return torch.arange(len(sequences), dtype=tensor.dtype).reshape(
                len(sequences), *tensor.shape[1:])
        parts = []
        for s in sequences:
            x, where = tensor, torch.tensor(s.positions, dtype=torch.long)
            if self.lead == FLAT:
                x = x.reshape(layout.batch, layout.length, *x.shape[1:])[s.row]
                x = x.index_select(0, where)
            elif self.lead == ROW:
                x = x.narrow(0, s.row, 1)
            for d in self.tokens:
                x = x.index_select(d, where)
            for d, a, b in self.windows:
                x = x.index_select(d, where[a:b])
            parts.append(x)
        if len(parts) == 1:
            return parts[0].contiguous()
        if len({tuple(p.shape) for p in parts}) == 1 and self.lead:
            return torch.cat(parts, 0)
        return torch.cat([p.reshape(-1) for p in parts])


def _joined_shape(parts: list[list[int]], lead: str) -> list[int]:
    if len(parts) == 1:
        return parts[0]
    if len({tuple(p) for p in parts}) == 1 and lead:
        return [sum(p[0] for p in parts), *parts[0][1:]]
    return [sum(math.prod(p) for p in parts)]


def _row_index(tensor: "torch.Tensor", batch: int) -> bool:
    import torch

    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool \
            or batch < 2 or tensor.numel() != batch:
        return False
    return bool(torch.equal(tensor.reshape(-1).long(), torch.arange(batch)))


def cut_for(shape: Seq[int], layout: Layout) -> Optional[Cut]:
    """The dims of a tensor of `shape` that hold this side's rows and positions, or None."""
    if not shape:
        return None
    lead = ""
    if shape[0] == layout.batch:
        lead = ROW
    elif shape[0] == 1:
        lead = BROADCAST
    elif layout.batch > 1 and shape[0] == layout.batch * layout.length:
        lead = FLAT
    if lead == FLAT:
        return Cut(FLAT, ())
    tokens = tuple(d for d in range(1 if lead else 0, len(shape)) if shape[d] == layout.length)
    if lead != ROW and not tokens:
        return None
    return Cut(lead, tokens)


def agrees(cut: Cut, shape: Seq[int], other: Optional[Seq[int]], layout: Layout,
           other_layout: Layout) -> Optional[Cut]:
    """`cut` without the dims the other side's same-named tensor (`other`, its shape) shows are
    not rows or positions: a dim is kept where that tensor's size there is what the other side's
    layout puts there, or where the two layouts put the same size there anyway."""
    if other is None or len(other) != len(shape):   # (no tensor there, or another one)
        return cut
    lead = cut.lead
    if lead == ROW and other[0] not in (other_layout.batch, 1):
        lead = "" if shape[0] == other[0] else lead
    if lead == BROADCAST and other[0] != 1 and other[0] != other_layout.batch:
        lead = ""
    tokens = tuple(d for d in cut.tokens if other[d] == other_layout.length
                   or (other[d] == shape[d] and layout.length == other_layout.length))
    if lead != ROW and not tokens:
        return None
    return Cut(lead, tokens)


def statistics(tensor: "torch.Tensor") -> Statistics:
    """max, min, mean, L2 norm, NaN and inf counts of a cut tensor, as capture records them
    (max and min of the values that are not NaN; float64, exact for integers)."""
    import torch

    from ...store.records import encode_float

    x = tensor.detach()
    if x.is_complex():
        x = x.abs()
    x = x.to(torch.float64)
    n = x.numel()
    if n == 0:
        return {}
    nan = int(torch.isnan(x).sum())
    inf = int(torch.isinf(x).sum())
    finite = x[~torch.isnan(x)]
    mx = float(finite.max()) if finite.numel() else math.nan
    mn = float(finite.min()) if finite.numel() else math.nan
    return {"max": encode_float(mx), "min": encode_float(mn), "mean": encode_float(float(x.mean())),
            "norm": encode_float(float(torch.linalg.vector_norm(x))), "nan": nan, "inf": inf}


__all__ = ["Cut", "cut_for", "agrees", "statistics", "ROW", "BROADCAST", "FLAT"]
