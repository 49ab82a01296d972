"""Where one recorded step goes: its writer, the describer that turns values into descriptors,
the batch of statistics awaiting a device transfer, the records waiting for it, the per-op call
counters, and the parameter gradients still arriving.

    sink = StepSink()
    sink.open(directory, meta, task="statistics")
    sink.emit(record)          # queued; written in batches once its statistics are known
    sink.close()               # everything on disk; counters start again for the next step

A full disk cuts the step where it stands (`_cut`): the records emitted before the failing op are
written if they fit, the writer closes (its `unfinished.json` says where the dump ends), one
warning is logged, and `stopped_by` keeps the error: the session records nothing more in this
run, and the user's training goes on untouched.
"""
from __future__ import annotations

import gc
import logging

from ..store.schema import PARAM_GRAD_WORD, Kind, Phase, Role, is_inductor, record_name
from ..store.writer import DumpWriter
from .describe import Describer
from .stacks import with_source
from .stats import StatsBatch

log = logging.getLogger("opdiff")

_FLUSH_EVERY = 256      # records queued before their statistics are resolved and written


class PendingRecord:
    """A record while its call is still running (`Session.begin` makes it, `Session.finish`
    completes it, backward.py's hooks take it for the call's backward record): the dict that
    will be written (`record`) and what capture needs to know about the call until then, which
    is never written: the call's counter (`index`), where its inputs' gradients go, taken before
    it ran (`edges`, see backward.py), whether an in-place op's inputs were finite before it
    overwrote them (`inputs_finite`), the overflow check's sentence about it (`message`)."""

    __slots__ = ("record", "index", "edges", "inputs_finite", "message")

    def __init__(self, record: dict, index: int = 0):
        self.record = record
        self.index = index
        self.edges: list | None = None
        self.inputs_finite: bool | None = None
        self.message = ""


class StepSink:
    """The open step of one debugger (nothing is open between steps: `writer` is None).

    `own`: the session's OwnWork (statistics are reduced under it); `selection`: its Selection
    (parameter gradients are named here); `failed(where, exc, record=None)`: how a failure is
    reported.
    """

    def __init__(self, own, selection, failed):
        self._own = own
        self._selection = selection
        self._failed = failed
        self.writer: DumpWriter | None = None
        self.describer: Describer | None = None
        self.stats = StatsBatch()
        self.counters: dict[str, int] = {}
        self.seq = 0
        self.pending: list[dict] = []
        self.forced_only = False        # overflow_check: only the monitor's records are written
        self._stack_ids: dict = {}      # user frames -> stack id in this step's writer
        self._param_grads: dict = {}    # module op -> {parameter name: gradient}
        self._frozen = False            # objects older than the step kept out of full GCs
        self._thresholds: tuple | None = None   # the collector's thresholds before the step
        self.stopped_by: OSError | None = None  # a full disk: nothing more is recorded this run

    # -- the step ----------------------------------------------------------------------------
    def open(self, directory, meta: dict, task: str) -> None:
        """Open the step's dump (OSError when it cannot be written)."""
        self.writer = DumpWriter(directory, meta)
        self._frozen = _freeze_older_objects()
        self._thresholds = _fewer_young_collections()
        light = task == "overflow_check"
        self.forced_only = light
        self.describer = Describer(None if light else self.stats, self.writer, save=task == "tensor")

    def close_writer(self) -> None:
        """Close this step's dump, and give the objects frozen at its start back to the garbage
        collector (also when overflow_check stops training mid-step, never to close it)."""
        if self.writer is not None:
            self.writer.close()
        self.writer = None
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
        if self._thresholds is not None:
            if gc.get_threshold()[0] == _raised(self._thresholds[0]):  # not changed since
                gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def end(self) -> None:
        """After the step closed: counters and stack ids start again."""
        self.describer = None
        self.counters.clear()
        self.seq = 0
        self._stack_ids.clear()     # they belong to the closed step's writer

    def next_index(self, op: str) -> int:
        """The call counter of `op` in this step (0 for its first call)."""
        n = self.counters.get(op, 0)
        self.counters[op] = n + 1
        return n

    def stack_id(self, frames: tuple) -> int | None:
        """The id of a call site (`stacks.user_frames`) in this step's stacks.jsonl."""
        sid = self._stack_ids.get(frames)
        if sid is None and self.writer is not None:
            sid = self._stack_ids[frames] = self.writer.stack_id(with_source(frames))
        return sid

    # -- records ------------------------------------------------------------------------------
    def emit(self, record: dict, force: bool = False) -> None:
        """Queue a finished record; statistics are resolved in a batch at flush."""
        if self.writer is None or (self.forced_only and not force):
            return
        if self.writer.full is not None:    # this op's tensors did not fit: the dump ends before it
            self._cut()
            return
        record["seq"] = self.seq
        self.seq += 1
        describer = self.describer
        if describer is not None and describer.outs:
            # dataflow: a forward op's outputs name it in later readers' descriptors; so do
            # the calls of Inductor's compiled backward (its kernels hand each other buffers,
            # where autograd hands eager's backward ops gradients, found through forward calls)
            inductor = is_inductor(record)
            if record.get("kind") in Kind.OPS and (record.get("phase") == Phase.FORWARD or
                                                   inductor):
                describer.produced(
                    record["seq"], record["name"], record.get("kind") in (Kind.API, Kind.KERNEL),
                    inductor)
            else:
                describer.outs.clear()
        if not self._selection.want_input:
            record.pop("inputs", None)
            record.pop("kwargs", None)
        if not self._selection.want_output:
            record.pop("outputs", None)
        self.pending.append(record)
        if len(self.pending) >= _FLUSH_EVERY:
            self.flush()

    def flush(self, wait_for_tensors: bool = False, last: bool = False) -> None:
        """Resolve the statistics of the queued records and write them (`last`: the step's last
        flush, after which its describer verifies nothing: no hashes of staged bytes)."""
        if not self.pending and not len(self.stats):
            if wait_for_tensors and self.writer is not None:
                self.writer.flush(wait_for_tensors=True)
                if self.writer.full is not None:
                    self._cut()
            return
        with self._own():
            try:
                self.stats.resolve(digests=not last)
            except Exception as exc:
                self._failed("statistics", exc)
                for record in self.pending:
                    record.setdefault("error", f"statistics: {type(exc).__name__}: {exc}"[:300])
        writer = self.writer
        for record in self.pending:
            if writer is not None:
                writer.write(record)
        self.pending.clear()
        if writer is not None:
            writer.flush(wait_for_tensors=wait_for_tensors)
            if writer.full is not None:
                self._cut()

    def _cut(self) -> None:
        """The disk is full: end this step's dump here and record nothing more in this run."""
        writer = self.writer
        if writer is None or writer.full is None or self.stopped_by is not None:
            return
        self.stopped_by = writer.full
        self.flush()                # the records emitted before the failure, if they fit
        self.close_writer()
        log.warning("opdiff: the disk is full (%s): the dump in %s ends at record %d (its "
                    "unfinished.json says so); opdiff records nothing more in this run, and the "
                    "training goes on untouched", writer.full.strerror or writer.full,
                    writer.directory, writer.records_written)

    # -- parameter gradients -------------------------------------------------------------------
    def add_param_grad(self, module_op: str, expected: int, pname: str, grad) -> None:
        """Collect one parameter's gradient; a module's record is emitted once all have arrived."""
        entry = self._param_grads.setdefault(module_op, {})
        entry[pname] = grad
        if len(entry) >= expected:
            self._emit_param_grads(module_op)

    def flush_param_grads(self) -> None:
        """The step ends: modules whose gradients are still partly missing are emitted as they are."""
        for module_op in list(self._param_grads):
            self._emit_param_grads(module_op)

    def _emit_param_grads(self, module_op: str) -> None:
        grads = self._param_grads.pop(module_op, None)
        if not grads or self.writer is None or self.describer is None:
            return
        op = f"{module_op}.{PARAM_GRAD_WORD}"
        name = record_name(module_op, Phase.BACKWARD, self.next_index(op), Kind.PARAM_GRAD)
        if not self._selection.want_backward or not self._selection.selected(name):
            return
        record: dict = {"name": name, "op": op, "kind": Kind.PARAM_GRAD, "phase": Phase.BACKWARD,
                  "module": None, "parameters": {}, "stack": None}
        with self._own():
            try:
                record["parameters"] = {p: self.describer.describe(g, name, Role.PARAMETERS, p)
                                        for p, g in grads.items()}
            except Exception as exc:
                self._failed("parameter gradients", exc, record)
        self.emit(record)


_YOUNG_FACTOR = 32
_SET_BY_US: set[int] = set()    # youngest-generation thresholds opdiff itself has set


def _raised(threshold: int) -> int:
    return min(threshold * _YOUNG_FACTOR, 1 << 30)


def _fewer_young_collections() -> tuple | None:
    """Collect the youngest generation 32 times less often while the step is recorded: its
    records and descriptors (some 20 small objects a record) triggered a collection every 35
    records, each scanning what the step had allocated since (1.5 ms of a 50 ms step on the
    per-op benchmark); 8 times less often still left one a step on a tiny Llama, scanning the
    queued records and the describer's caches (2 ms a step there; 0.4 ms at 32).
    They are freed by reference counting as before; the thresholds come back
    when the step closes (unless the program changed them meanwhile). Returns the thresholds to
    restore, or None where nothing was changed. A threshold opdiff set itself (a step of another
    debugger still open, or one never closed) is left as it is: raised again at every step, it
    grew past what `gc.set_threshold` takes and the next step failed to open."""
    if not gc.isenabled():
        return None
    thresholds = gc.get_threshold()
    if thresholds[0] <= 0 or thresholds[0] in _SET_BY_US:
        return None
    _SET_BY_US.add(_raised(thresholds[0]))
    gc.set_threshold(_raised(thresholds[0]), *thresholds[1:])
    return thresholds


def _freeze_older_objects() -> bool:
    """Keep every object that exists now out of Python's full collections until the step closes.

    A recorded step allocates thousands of small dicts, which push the collector into a full
    collection about every 20 steps; with a framework loaded that scans some 300k objects
    (170 ms on the benchmark CNN, 8 ms a step on average). Frozen objects are still freed by
    reference counting; a cycle among them is collected after `gc.unfreeze()` at step close.
    Left alone if the program froze objects itself (a pre-fork server, say) or disabled the GC.
    """
    if not hasattr(gc, "freeze") or not gc.isenabled() or gc.get_freeze_count():
        return False
    gc.freeze()
    return True
