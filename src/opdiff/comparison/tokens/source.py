"""A side's dump as the token alignment rewrote it: `tensor(key)` of a cut key loads the
recorded tensor and cuts it down to the matched sequences' real tokens (`slicing.Cut`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional, Sequence as Seq

from ...store.schema import Record, Statistics
from ...store.source import DumpSource
from .sequences import Layout, Sequence
from .slicing import Cut


class SlicedSource:
    """One side's dump with its rewritten records and its cut tensors; everything else is the
    dump's own. It holds no complete set of an op's inputs any more (they are cut), so replay,
    which re-runs ops on them with their recorded arguments, is not offered (`holds_tensors`)."""

    def __init__(self, inner: DumpSource, records: list[Record], layout: Layout,
                 sequences: Seq[Sequence]) -> None:
        self.inner, self.layout, self.sequences = inner, layout, tuple(sequences)
        self._records = records
        self.cuts: dict[str, tuple[str, Cut]] = {}     # cut key -> (recorded key, cut)
        # cut key -> (its shape, its statistics): each cut tensor is loaded once to describe it
        self.measured: dict[str, tuple[list[int], Optional[Statistics]]] = {}
        self.path: Path = inner.path
        self.meta: dict[str, Any] = inner.meta
        self.step, self.rank, self.format = inner.step, inner.rank, inner.format

    def cut_key(self, key: str, cut: Cut) -> str:
        """The key the cut tensor is served under (one per recorded key and cut)."""
        windows = ",".join(f"{d}[{a}:{b}]" for d, a, b in cut.windows)
        name = f"{key}#tokens:{cut.lead or '-'}:{','.join(map(str, cut.tokens))}:{windows}" \
            + (f"+{cut.offset}" if cut.offset else "")
        self.cuts[name] = (key, cut)
        return name

    def keep(self, records: list[Record]) -> None:
        """The rewritten records `records()` yields."""
        self._records = records

    def records(self) -> Iterator[Record]:
        return iter(self._records)

    def tensor(self, key: str) -> Any:
        spec = self.cuts.get(key)
        if spec is None:
            return self.inner.tensor(key)
        whole = self.inner.tensor(spec[0])
        if whole is None:
            return None
        return spec[1].apply(whole, self.sequences, self.layout)

    def part(self, key: str, k: int) -> Any:
        """The tensor of `key` holding the k-th matched sequence's tokens only (or the whole
        tensor where `key` is not a cut one), or None."""
        spec = self.cuts.get(key)
        if spec is None:
            return self.inner.tensor(key)
        whole = self.inner.tensor(spec[0])
        if whole is None or spec[1].offset:
            return None
        return spec[1].apply(whole, self.sequences[k:k + 1], self.layout)

    def tensor_keys(self) -> list[str]:
        return self.inner.tensor_keys() + list(self.cuts)

    def stack(self, stack_id: Optional[int]) -> list[dict[str, Any]]:
        return self.inner.stack(stack_id)

    @property
    def holds_tensors(self) -> bool:
        return False

    def record_count(self) -> int:
        return len(self._records)


__all__ = ["SlicedSource"]
