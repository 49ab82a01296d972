"""Append-only dump writer used by capture (and by the ONNX runner).

Records are buffered and appended to records.jsonl every `flush_every` records and on
`flush()`/`close()`, straight to the OS (`durable.RawFile`), so a killed process leaves every
record up to the last flush readable; records go before the tensors they name. Tensors go into
safetensors shards, each written under a temporary name as tensors arrive and renamed once its
header is in place: a shard is either whole or absent (a failed one is removed). CPU tensors are
written by the calling thread when they are saved, device tensors through a bounded queue by a
background thread (see _TensorSink). A tensor that views the same bytes of one saved before is a
reference in its shard's header instead (see .references).

A full disk ends the step's dump where it stands: a records line cut by it is cut back, the
partial shard removed, `full` set, and `unfinished.json` says "disk full" at which record (see
`durable`); a record whose tensor was not written reads as its statistics. A step closed
cleanly leaves no `unfinished.json`.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

from ..dtypes import SAFETENSORS_CODES, short_dtype
from . import layout
from .reader import REF_PREFIX
from .durable import RawFile, Unfinished, disk_full, write_replacing
from .records import SCHEMA_VERSION, dumps, json_text, stack_frame, stack_line
from .references import Aliases, Base, Ref, host_elements

if TYPE_CHECKING:
    import torch

# queued: (key, tensor, bytes, alias link), "flush", or None (stop)
_Item = Union[None, str, "tuple[str, torch.Tensor, int, Any]"]

log = logging.getLogger("opdiff")

_SHARD_BYTES = 64 << 20      # one safetensors file holds about this much
_QUEUE_BYTES = 256 << 20     # capture blocks when this much is waiting to be written


class _TensorSink(threading.Thread):
    """Collects tensors into safetensors shards.

    CPU tensors are written in the calling thread, at once: their bytes are in the shard before
    the op can change them, so the caller need not copy them (a private copy of every saved
    activation made the CNN's step fault in about 120 MB of fresh pages), and a background
    writer fighting the training thread for the GIL cost far more than the writes (benchmark
    transformer, 100 MB a step: 230 ms added by the thread, 30 ms inline). Device tensors go
    through a queue to this thread (started by the first), copied to the host meanwhile.
    """

    def __init__(self, directory: Path, references: bool = True, same_bytes: bool = True):
        super().__init__(name="opdiff-tensor-writer", daemon=True)
        self.aliases: Aliases | None = Aliases(same_bytes) if references else None
        self.directory = directory
        self.queue: queue.Queue[_Item] = queue.Queue()
        self.pending_bytes = 0
        self.cond = threading.Condition()
        self.lock = threading.Lock()      # guards the batch and the shard files
        self.started = False
        self.shard_index = 0
        self.error: BaseException | None = None
        self._shard: _StreamingShard | None = None
        self._batch: dict[str, Any] = {}     # dtypes the streaming writer does not know (complex)
        self.referenced_bytes = 0            # tensor bytes stored as references, not written

    def put(self, key: str, tensor: torch.Tensor, origin: torch.Tensor | None = None) -> None:
        """Save `tensor` under `key`: a CPU tensor is written now (the caller may change it right
        after), a device tensor must be a private copy (it is written later). `origin`, the
        tensor that copy was made from, lets a view of a saved tensor be stored as a reference
        (a CPU tensor that shares the original's storage is its own origin)."""
        if self.error is not None:
            return
        nbytes = tensor.numel() * tensor.element_size()
        link = None
        if self.aliases is not None and (origin is not None or tensor.device.type == "cpu"):
            link = self.aliases.link(key, origin if origin is not None else tensor)
        if tensor.device.type == "cpu":
            self._guarded(self._add, key, tensor, nbytes, link)
        else:
            self._enqueue(key, tensor, nbytes, link)

    def _enqueue(self, key: str, tensor: torch.Tensor, nbytes: int, link: Any) -> None:
        """Hand a tensor to the background thread (started by the first one)."""
        if not self.started:
            self.started = True
            self.start()
        with self.cond:
            # Backpressure keeps memory bounded: wait while too much is queued.
            while self.pending_bytes > _QUEUE_BYTES and self.is_alive():
                self.cond.wait(timeout=1.0)
            self.pending_bytes += nbytes
        self.queue.put((key, tensor, nbytes, link))

    def flush(self, wait: bool) -> None:
        """Write what is held as a shard (with `wait`, including every queued device tensor)."""
        if self.started:
            self.queue.put("flush")
            if wait:
                self.queue.join()
        else:
            self._guarded(self._write_shard)

    def close(self) -> None:
        if self.started:
            self.queue.put(None)
            self.join()
        else:
            self._guarded(self._write_shard)
        if self.aliases is not None:
            self.aliases._sweep(everything=True)

    def run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None or isinstance(item, str):     # None: stop; "flush"
                    self._guarded(self._write_shard)
                    if item is None:
                        return
                    continue
                key, tensor, nbytes, link = item
                host = tensor.detach().to("cpu")
                with self.cond:
                    self.pending_bytes -= nbytes
                    self.cond.notify_all()
                self._guarded(self._add, key, host, nbytes, link)
            except BaseException as exc:  # never raise into the user's process
                self._failed(exc)
            finally:
                self.queue.task_done()

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        with self.lock:
            if self.error is not None:
                return
            try:
                fn(*args)
            except BaseException as exc:  # never raise into the user's process
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if self.error is None and not disk_full(exc):   # (a full disk: the DumpWriter says it)
            log.warning("opdiff: writing tensors failed (%s); tensors are no longer saved", exc)
        self.error = exc
        self._batch.clear()
        if self._shard is not None:
            self._shard.abandon()       # removed: a partial shard must not keep filling the disk
            self._shard = None

    def _add(self, key: str, tensor: torch.Tensor, nbytes: int, link: Any = None) -> None:
        if _dtype_name(tensor) is None:      # kept (a copy) for a shard of its own at flush
            self._batch[key] = tensor.clone()
            return
        ref = link.entry(tensor) if isinstance(link, Ref) else None   # None unless same bytes
        fingerprint = None
        if ref is None:
            tensor = tensor.contiguous()
        if ref is None and self.aliases is not None:      # the bytes of one written before?
            copies, fingerprint = self.aliases.same_bytes(tensor)
            for copy in copies:
                ref = copy.entry(tensor)
                if ref is not None:
                    if isinstance(link, Base):       # its views: to those bytes
                        link.key, link.shard, link.offset = copy.base.key, copy.base.shard, copy.base.offset
                    break
        if ref is not None:
            self._place(lambda shard: shard.add_ref(key, ref), key)
            self.referenced_bytes += nbytes
            return
        shard = self._place(lambda shard: shard.add(key, tensor), key)
        if isinstance(link, Base) or fingerprint is not None:   # later views, copies may refer to it
            base = link if isinstance(link, Base) else Base(key, 0, 0, nbytes, tensor.dtype, 0)
            base.shard, base.offset = shard, shard.HEADER_BYTES + shard.header[key]["data_offsets"][0]
            if fingerprint is not None and self.aliases is not None:
                self.aliases.written(fingerprint, base)
        if shard.data_bytes >= _SHARD_BYTES:
            self._finish_shard()

    def _place(self, add: Callable[[_StreamingShard], bool], key: str) -> _StreamingShard:
        """add() to the open shard, or to a new one when none is open or its header is full."""
        if self._shard is None or not add(self._shard):
            self._finish_shard()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._shard = _StreamingShard(self._next_path().with_suffix(".tmp"))
            if not add(self._shard):
                raise ValueError(f"tensor name too long for a shard header: {key[:80]}...")
        return self._shard

    def _next_path(self) -> Path:
        path = self.directory / f"shard_{self.shard_index:05d}.safetensors"
        self.shard_index += 1
        return path

    def _finish_shard(self) -> None:
        shard, self._shard = self._shard, None
        if shard is not None:
            try:
                shard.finish()
            except BaseException:
                shard.abandon()
                raise

    def _write_shard(self) -> None:
        """Close the shard being written (and write the odd-dtype ones): a flush point."""
        self._finish_shard()
        if self._batch:
            self.directory.mkdir(parents=True, exist_ok=True)
            from safetensors.torch import save    # dtypes the streaming writer lacks
            write_replacing(self._next_path(), save({k: t.contiguous() for k, t in self._batch.items()}))
            self._batch = {}


def _dtype_name(t: torch.Tensor) -> str | None:
    """safetensors' code for t's dtype, or None for one the streaming writer does not know."""
    return SAFETENSORS_CODES.get(short_dtype(t.dtype) or "")


class _StreamingShard:
    """A safetensors file written as tensors arrive, under a temporary name.

    The header goes first in the format, but is only known at the end: a fixed region is kept
    for it at the front (written as zeros at once, so filling it needs no more space), filled at
    `finish()` with the JSON padded with spaces (which the format allows), and the file is then
    renamed to its final name. A shard whose header would outgrow the region is finished early.
    Bytes go through `durable.RawFile` (small tensors gathered up to 1 MiB); `abandon()` removes
    the file.
    """

    HEADER_BYTES = 128 << 10     # 8-byte length + JSON; about 1000 entries

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.path = tmp              # where its bytes are now: tmp, then the final name
        self.file = RawFile(tmp, append=False, buffer=1 << 20)
        self.header: dict[str, Any] = {}
        self.refs: dict[str, str] = {}     # key -> JSON of a reference, in "__metadata__"
        self.header_len = 2          # "{}"
        self.data_bytes = 0
        self.open = True
        self.reader: Any = None      # a second handle, to read back what was written (references)
        try:
            self.file.write(bytes(self.HEADER_BYTES))
            self.file.flush()
        except BaseException:
            self.abandon()
            raise

    def add_ref(self, key: str, ref: dict[str, Any]) -> bool:
        """Note that `key` is `ref["base"]`'s bytes seen through `ref`'s offset, shape and
        strides (see reader.REF_PREFIX); False when the header is full."""
        value = json.dumps(ref, separators=(",", ":"))
        size = len(json.dumps({REF_PREFIX + key: value}, separators=(",", ":"))) - 1
        size += 0 if self.refs else len('"__metadata__":{},')
        if self.header_len + size > self.HEADER_BYTES - 8:
            return False
        self.refs[REF_PREFIX + key] = value
        self.header_len += size
        return True

    def read(self, offset: int, nbytes: int) -> Any:
        """`nbytes` of the shard from `offset` (written already), copied into a uint8 tensor."""
        import torch

        data = torch.empty(nbytes, dtype=torch.uint8)
        if self.open:
            self.file.flush()
            if self.reader is None:
                self.reader = open(self.tmp, "rb")
            got = self._read_at(self.reader, offset, data)
        else:
            with open(self.path, "rb") as f:
                got = self._read_at(f, offset, data)
        if got != nbytes:
            raise ValueError(f"{self.path}: shorter than what was written to it")
        return data

    @staticmethod
    def _read_at(f: Any, offset: int, data: Any) -> int:
        f.seek(offset)
        return int(f.readinto(data.numpy()))

    def add(self, key: str, t: torch.Tensor) -> bool:
        """Write t's bytes and note its entry; False (nothing written) when the header is full."""
        nbytes = t.numel() * t.element_size()
        entry = {"dtype": _dtype_name(t), "shape": list(t.shape),
                 "data_offsets": [self.data_bytes, self.data_bytes + nbytes]}
        size = len(json.dumps({key: entry}, separators=(",", ":"))) - 1    # '"key":{...},'
        if self.header_len + size > self.HEADER_BYTES - 8:
            return False
        t = t.contiguous()
        if t.numel():
            # (numpy's arrays are buffers; its stubs do not say so to every mypy)
            self.file.write(memoryview(host_elements(t, 1)))
        self.header[key] = entry
        self.header_len += size
        self.data_bytes += nbytes
        return True

    def finish(self) -> None:
        header = {"__metadata__": self.refs, **self.header} if self.refs else self.header
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (self.HEADER_BYTES - 8 - len(text))
        self.file.flush()
        self.file.pwrite((self.HEADER_BYTES - 8).to_bytes(8, "little") + text, 0)
        self.file.close()
        self._close_reader()
        final = self.tmp.with_suffix(".safetensors")
        os.replace(self.tmp, final)
        self.path = final

    def abandon(self) -> None:
        """Give the shard up: close it and remove its file (the space goes back at once, even
        while a reader still holds it open)."""
        for step in (lambda: self.file.truncate(0), self.file.close, self._close_reader,
                     lambda: os.unlink(self.tmp)):
            try:
                step()
            except OSError:
                pass

    def _close_reader(self) -> None:
        self.open = False
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class DumpWriter:
    """Writes one step of one rank: `DumpWriter(dir, meta)`, then `write()`, `save_tensor()`, `close()`.

    Raises OSError when the step cannot even be opened (nothing of it is left behind then).
    `full`: the OSError of a full disk, once one ended the dump (see the module docstring);
    `records_written`, `last_record`: what records.jsonl holds."""

    references = True     # store views of saved tensors as references (False: bytes again)
    same_bytes = True     # ... and tensors repeating the bytes of one written before

    def __init__(self, directory: str | os.PathLike[str], meta: dict[str, Any], flush_every: int = 256):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flush_every = flush_every
        self.records_written = 0
        self.last_record: str | None = None
        self.full: OSError | None = None
        self.disabled = False
        self._failure: BaseException | None = None
        self._buffer: list[tuple[str, str, str | None]] = []   # ("r" | "s", JSON line, record name)
        self._stack_ids: dict[tuple[tuple[str, int, str, str], ...], int] = {}
        self._sink: _TensorSink | None = None
        self._mark = Unfinished(self.directory)     # first: a step cut from here on says so
        meta = {"format_version": layout.FORMAT_VERSION, "schema_version": SCHEMA_VERSION, **meta}
        opened: list[RawFile] = []
        try:
            write_replacing(self.directory / layout.META,
                            json_text(meta, indent=2).encode())
            opened += [RawFile(self.directory / n, append=True) for n in (layout.RECORDS, layout.STACKS)]
        except BaseException:
            for f in opened:
                f.close()
            for name in (layout.RECORDS, layout.STACKS, layout.META):
                (self.directory / name).unlink(missing_ok=True)
            self._mark.remove()
            raise
        self._records, self._stacks = opened

    # -- stacks -------------------------------------------------------------------------------
    def stack_id(self, frames: tuple[tuple[Any, ...], ...]) -> int:
        """Id of a call stack, writing it the first time it is seen.

        frames: tuple of (file, line, function, code) tuples, innermost user frame first; a
        fifth item, ((line number, text), ...), is written as the frame's "context".
        """
        sid = self._stack_ids.get(frames)
        if sid is None:
            sid = len(self._stack_ids)
            self._stack_ids[frames] = sid
            self._buffer.append(("s", stack_line(sid, frames), None))
        return sid

    def stack_frames(self, stack_id: int | None) -> list[dict[str, Any]]:
        """The frames ({"file", "line", "function", "code"}) of a stack id written by this
        writer ([] for None or an id it never gave)."""
        if stack_id is None:
            return []
        for frames, sid in self._stack_ids.items():
            if sid == stack_id:
                return [stack_frame(f) for f in frames]
        return []

    # -- records ------------------------------------------------------------------------------
    def write(self, record: dict[str, Any]) -> None:
        """Queue one record (already fully resolved: statistics are plain numbers)."""
        if self.disabled:
            return
        self._buffer.append(("r", dumps(record), record.get("name")))
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def save_tensor(self, key: str, tensor: torch.Tensor, origin: torch.Tensor | None = None) -> None:
        """Save a tensor: a CPU tensor is written at once; a device tensor is queued for the
        background writer and must be a private copy, made from `origin` (see _TensorSink.put).
        A tensor viewing the very bytes of one saved before is stored as a reference to it."""
        if self.disabled or self.full is not None:
            return
        if self._sink is None:
            self._sink = _TensorSink(self.directory / layout.TENSORS, self.references, self.same_bytes)
        self._sink.put(key, tensor, origin)
        if disk_full(self._sink.error):
            self._stop(self._sink.error)        # (the records so far are still written)

    @property
    def referenced_bytes(self) -> int:
        """Bytes of saved tensors stored as references to others instead of written again."""
        return self._sink.referenced_bytes if self._sink is not None else 0

    def flush(self, wait_for_tensors: bool = False) -> None:
        """Append buffered stacks and records to disk (stacks first, so ids always resolve), then
        ask the tensor writer to write a shard of what it holds; with `wait_for_tensors` this
        returns once it has, so a crash afterwards loses none of the tensors recorded so far
        (and `unfinished.json` says the step was whole then: see `durable`)."""
        if self._buffer and not self.disabled:
            self._write_buffer()
        if self._sink is not None and not self.disabled and self.full is None:
            self._sink.flush(wait_for_tensors)
            if disk_full(self._sink.error):
                self._stop(self._sink.error)
        if wait_for_tensors and self._failure is None:
            self._mark.set({"state": "stopped", "records": self.records_written})

    def _write_buffer(self) -> None:
        stacks = [line for kind, line, _ in self._buffer if kind == "s"]
        records = [(line, name) for kind, line, name in self._buffer if kind == "r"]
        self._buffer.clear()
        for f, lines in ((self._stacks, stacks), (self._records, [line for line, _ in records])):
            if not lines:
                continue
            size = f.size
            try:
                f.write(("\n".join(lines) + "\n").encode("utf-8"))
            except OSError as exc:      # disk full and friends: stop dumping, let training go on
                try:
                    f.truncate(size)    # no half line is left behind
                except OSError:
                    pass
                self._stop(exc)
                self.disabled = True    # (after a full disk stopped the tensors too)
                return
        if records:
            self.records_written += len(records)
            self.last_record = records[-1][1]

    def _stop(self, exc: BaseException | None) -> None:
        """A write failed. A full disk: no more tensors, and `full` tells the caller to stop
        queueing records (those queued go to disk if they still fit: the partial shard is
        gone). Another error: nothing more is written."""
        if self._failure is None and exc is not None:
            self._failure = exc
        else:
            return
        if isinstance(exc, OSError) and disk_full(exc):
            self.full = exc
        else:
            log.warning("opdiff: cannot write the dump any more (%s); dumping stopped", exc)
            self.disabled = True

    def close(self) -> None:
        """Flush everything and wait for the tensor writer to finish its last shard. A step cut
        by a failed write keeps `unfinished.json`, saying where it ends."""
        try:
            self.flush()
        except OSError as exc:
            self._stop(exc)
        if self._sink is not None:
            self._sink.close()
            if disk_full(self._sink.error):
                self._stop(self._sink.error)
            self._sink = None
        for f in (self._records, self._stacks):
            try:
                f.close()
            except OSError:
                pass
        self.disabled, failure = True, self._failure
        if failure is None:
            return self._mark.remove()
        self._mark.set({"state": "disk full" if disk_full(failure) else "write failed",
                        "records": self.records_written, "last_record": self.last_record,
                        "error": f"{type(failure).__name__}: {failure}"})
        self._mark.keep()
