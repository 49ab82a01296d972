"""DTensor's redistributions between layouts: the ops around a collective that only move pieces.

Sequence parallelism (torch `SequenceParallel`, `ColwiseParallel(input_layouts=Shard(1))`,
`RowwiseParallel(output_layouts=Shard(1))`) moves activations between a split sequence and
whole or partial ones. DTensor gathers along dim 0 and reorders:

    all_gather_into_tensor -> wait_tensor -> chunk -> cat(dim=d) -> contiguous    # Shard(d) -> R

and reorders before it scatters a partial sum:

    chunk(dim=d) -> cat(dim=0) -> reduce_scatter_tensor                             # P -> Shard(d)

None of them is an op of the one-device run. `Finder` finds them in one rank's records
(positions, streamed): after a group collective, the `wait_tensor`, `chunk`, `cat` and
`contiguous` that read only what it made; before one, a `cat` of one `chunk`'s pieces that the
collective reads. The plan leaves them out like the collectives themselves (`plan._drop`).
"""
from __future__ import annotations

from typing import Optional

from ...store.schema import Record
from ...store.records import iter_tensors, producer_of

_AFTER = ("Distributed.wait_tensor", "Torch.chunk", "Torch.cat", "Tensor.contiguous",
          "Tensor.chunk", "Torch.split", "Tensor.split")
_REORDER = ("Torch.cat",)
_PIECES = ("Torch.chunk", "Tensor.chunk", "Torch.split", "Tensor.split")
_WINDOW = 8          # records looked back at for a collective's reorder


def _group_collective(rec: Record) -> bool:
    group = rec.get("group")
    return (str(rec.get("op")).startswith("Distributed.") and isinstance(group, dict)
            and "peer" not in group and rec.get("op") != "Distributed.wait_tensor")


def _inputs(rec: Record) -> list[Optional[tuple[int, str]]]:
    return [producer_of(d) for _, role, d in iter_tensors(rec) if role == "input"]


class Finder:
    """Feed one rank's records in order (`feed`); `positions`: its redistribution ops."""

    def __init__(self) -> None:
        self.positions: set[int] = set()
        self._made: set[int] = set()                  # seqs whose outputs are moved pieces
        self._recent: list[tuple[int, int, Record]] = []   # (pos, seq, record)

    def feed(self, pos: int, rec: Record) -> None:
        got = rec.get("seq")
        seq = got if isinstance(got, int) else pos
        op = str(rec.get("op"))
        if _group_collective(rec):
            self._made.add(seq)
            self._reorder_before(rec)
        elif op in _AFTER:
            srcs = _inputs(rec)
            if srcs and all(s is not None and s[0] in self._made for s in srcs):
                self.positions.add(pos)
                self._made.add(seq)
        self._recent.append((pos, seq, rec))
        del self._recent[:-_WINDOW]

    def _reorder_before(self, collective: Record) -> None:
        """The `cat` of one `chunk`'s pieces that `collective` reads, and that `chunk`."""
        srcs = [s for s in _inputs(collective) if s is not None]
        if not srcs:
            return
        by_seq = {seq: (pos, rec) for pos, seq, rec in self._recent}
        cat = by_seq.get(srcs[0][0])
        if cat is None or cat[1].get("op") not in _REORDER:
            return
        pieces = {s[0] for s in _inputs(cat[1]) if s is not None}
        if len(pieces) != 1 or None in _inputs(cat[1]):
            return
        chunk = by_seq.get(next(iter(pieces)))
        if chunk is None or chunk[1].get("op") not in _PIECES:
            return
        self.positions.update((cat[0], chunk[0]))


__all__ = ["Finder"]
