"""A many-pair compare's rows on disk: each pair's worker writes them, the driver streams them.

With many step/rank pairs the driver does not hold every row: each pair's task writes its rows
to a spool file (pickled chunks of `CHUNK` rows) and sends back only its pair's outcome (counts,
first divergence, notes) and where its rows lie. `PairRows` and `ChainedRows` are read-only
sequences over those files: iterating reads one chunk at a time, so writing the CSV or
rows.jsonl of 64 ranks keeps one chunk in memory, not 64 pairs' rows. The cross-rank analysis
reads a pair's rows only where it needs them (a collective's inputs, the first divergence's
position).

    spool = Spool()                                     # a temporary directory, removed with
    meta = write_pair(rows, spool.path_for(3))          # the last sequence that reads it
    rows = PairRows(spool, meta)                        # == the list that was written
    everything = ChainedRows([rows, ...])               # each row tagged with its step/rank

A sequence pickles as a plain list (so a result still travels whole between processes), and
compares equal to any sequence of the same rows.
"""
from __future__ import annotations

import os
import pickle
import shutil
import signal
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Iterator, Optional, overload

from .result import TensorRow

CHUNK = 512


@dataclass(frozen=True)
class SpoolFile:
    """Where a pair's rows lie: the file, how many rows, each chunk's byte offset, and the
    step/rank the merged result tags its rows with."""
    path: str
    count: int
    offsets: tuple[int, ...]
    step: Optional[int] = None
    rank: Optional[int] = None


def encode_pair(rows: Sequence[TensorRow]) -> tuple[bytes, tuple[int, ...]]:
    """The bytes of a spool file holding `rows`, and its chunks' offsets."""
    parts: list[bytes] = []
    offsets: list[int] = []
    at = 0
    for i in range(0, len(rows), CHUNK):
        blob = pickle.dumps(list(rows[i:i + CHUNK]), protocol=pickle.HIGHEST_PROTOCOL)
        offsets.append(at)
        parts.append(blob)
        at += len(blob)
    return b"".join(parts), tuple(offsets)


def write_pair(rows: Sequence[TensorRow], path: str, step: Optional[int] = None,
               rank: Optional[int] = None) -> SpoolFile:
    """Write `rows` as a spool file at `path`; return where they lie."""
    blob, offsets = encode_pair(rows)
    with open(path, "wb") as f:
        f.write(blob)
    return SpoolFile(path=path, count=len(rows), offsets=offsets, step=step, rank=rank)


class Spool:
    """A temporary directory of spool files, removed when no sequence reads it any more (or at
    exit). `OPDIFF_SPOOL_DIR` chooses where it is made (default: the system's temporary dir).
    While one lives, SIGTERM and SIGHUP (a CI timeout, a closed terminal) end the process as an
    exit (`SystemExit(128 + signal)`) rather than at once, so it is removed and the pools shut
    down; a handler the program set itself is left alone."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="opdiff-rows-", dir=os.environ.get("OPDIFF_SPOOL_DIR"))
        _hold_signals()
        self._cleanup = weakref.finalize(self, _remove, self.dir)

    def path_for(self, i: int) -> str:
        """The spool file of the i-th pair."""
        return os.path.join(self.dir, f"pair{i}.rows")

    def write_blob(self, i: int, blob: bytes) -> str:
        """Write a pair's spool bytes (made by a remote task's `encode_pair`); return the path."""
        path = self.path_for(i)
        with open(path, "wb") as f:
            f.write(blob)
        return path


_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
_held: dict[int, Any] = {}      # the signals we handle now, and the handlers they had
_live: list[int] = [0]          # spools alive in this process


def _exit_by(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _hold_signals() -> None:
    _live[0] += 1
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        if sig not in _held and signal.getsignal(sig) == signal.SIG_DFL:
            _held[sig] = signal.signal(sig, _exit_by)


def _remove(path: str) -> None:
    shutil.rmtree(path, True)
    _live[0] -= 1
    if _live[0] <= 0 and threading.current_thread() is threading.main_thread():
        for sig, before in list(_held.items()):
            if signal.getsignal(sig) is _exit_by:
                signal.signal(sig, before)
            del _held[sig]


class _Rows(Sequence[TensorRow]):
    """What PairRows and ChainedRows share: equality with any sequence, pickling as a list."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {len(self)} rows on disk>"

    @overload
    def __getitem__(self, i: int) -> TensorRow: ...

    @overload
    def __getitem__(self, i: slice) -> list[TensorRow]: ...

    def __getitem__(self, i: int | slice) -> TensorRow | list[TensorRow]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row index out of range")
        return self._at(i)

    def _at(self, i: int) -> TensorRow:
        raise NotImplementedError


class PairRows(_Rows):
    """One pair's rows, read from its spool file chunk by chunk; `tagged` sets each row's step
    and rank (the merged result's rows), untagged they are the pair's own result's rows."""

    def __init__(self, spool: Spool, meta: SpoolFile, tagged: bool = False) -> None:
        self.spool, self.meta, self.tagged = spool, meta, tagged

    def tagged_view(self) -> PairRows:
        """The same rows with their step and rank set."""
        return PairRows(self.spool, self.meta, tagged=True)

    def __len__(self) -> int:
        return self.meta.count

    def _chunk(self, f: Any, k: int) -> list[TensorRow]:
        f.seek(self.meta.offsets[k])
        rows: list[TensorRow] = pickle.load(f)
        if self.tagged:
            rows = [replace(r, step=self.meta.step, rank=self.meta.rank) for r in rows]
        return rows

    def __iter__(self) -> Iterator[TensorRow]:
        if not self.meta.count:
            return
        with open(self.meta.path, "rb") as f:
            for k in range(len(self.meta.offsets)):
                yield from self._chunk(f, k)

    def _at(self, i: int) -> TensorRow:
        with open(self.meta.path, "rb") as f:
            return self._chunk(f, i // CHUNK)[i % CHUNK]


class ChainedRows(_Rows):
    """Several pairs' rows one after the other (a many-pair result's `rows`)."""

    def __init__(self, parts: Sequence[PairRows]) -> None:
        self.parts = list(parts)
        self._len = sum(len(p) for p in self.parts)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[TensorRow]:
        for p in self.parts:
            yield from p

    def _at(self, i: int) -> TensorRow:
        for p in self.parts:
            if i < len(p):
                return p[i]
            i -= len(p)
        raise IndexError("row index out of range")


def on_disk(rows: object) -> bool:
    """Whether `rows` is a spooled sequence (so a caller should stream it, not copy it)."""
    return isinstance(rows, _Rows)


__all__ = ["Spool", "SpoolFile", "PairRows", "ChainedRows", "write_pair", "encode_pair",
           "on_disk", "CHUNK"]
