"""The capture session: what the interception layers (`api.py`, `modules.py`, `aten.py`) share.

One Session serves one PrecisionDebugger. It is made of small parts, each with one job:

- `own` (guards.OwnWork): marks opdiff's own tensor work, which no layer records;
- `modules` (tracker.ModuleStack): the module calls running on this thread;
- `selection` (selection.Selection): scope, list and data_mode;
- `sink` (sink.StepSink): the open step: writer, describer, statistics, counters, records.

Everything the layers do is guarded so that a failure inside capture is logged once, recorded on
the op, and never raised into the user's code.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from .. import __version__, ops
from ..config import DumpConfig
from ..errors import ConfigError, OverflowDetected
from ..store import layout
from ..store.durable import disk_full
from ..store.schema import Role
from . import collectives, stacks
from .guards import OwnWork
from .leaves import Leaves, tag_leaves
from .selection import Selection, name_matches, normalize_name
from .sink import PendingRecord, StepSink
from .tracker import ModuleStack

if TYPE_CHECKING:
    from .describe import Describer
    from .overflow import OverflowMonitor

log = logging.getLogger("opdiff")


# the names a first argument goes by when passed by keyword
_FIRST_KEYWORDS = ("self", "input", "tensor")


class Session:
    """State of one debugger: the current step and the parts above."""

    def __init__(self, config: DumpConfig):
        self.config = config
        self.step_index = 0
        self.errors = 0
        self.opened = False     # a step's dump was opened in this run
        self.own = OwnWork()
        self.modules = ModuleStack()
        self.selection = Selection(config)
        self.sink = StepSink(self.own, self.selection, self.failed)
        self.overflow: OverflowMonitor | None = None   # set by the overflow_check task (see overflow.py)
        self.at_close: list = []        # undo at step close: hooks on leaves, nodes held (backward.py)
        self.leaves = Leaves()          # the model's parameters and buffers, the root call's inputs
        self.model = None               # the model start() was given (its TP styles: meta.json)
        # Which layer advances the describer's epoch (handles.py): each op's inputs when the API
        # layer records (a module's inputs, read in its pre-hook, are checked again by its first
        # op), each module call at L0.
        self.ops_advance_epoch = False
        # dataflow by data address too (describe.py `buffers`): at L2, and once Inductor's
        # kernels are recorded at mix (capture/inductor.py)
        self.buffers = config.level == "L2"

    # -- what the layers read on every op ------------------------------------------------------
    @property
    def writer(self):
        """This step's DumpWriter; None when no step is being recorded."""
        return self.sink.writer

    @property
    def describer(self):
        return self.sink.describer

    @property
    def stats(self):
        """The StatsBatch of the steps to come (a benchmark may replace it before start)."""
        return self.sink.stats

    @stats.setter
    def stats(self, batch) -> None:
        self.sink.stats = batch

    @property
    def recording(self) -> bool:
        return self.sink.writer is not None

    def fail(self, pending: PendingRecord | None, exc: BaseException, where: str = "") -> None:
        """The one failure policy of every layer: logged the first time, noted on the pending
        record (which is still written, with what it has), never raised into the user's run
        (only the overflow check's OverflowDetected stops it, on purpose)."""
        if pending is None:
            self.failed(where, exc)
        else:
            self.failed(where or pending.record["name"], exc, pending.record)

    def failed(self, where: str, exc: BaseException, record: dict | None = None) -> None:
        """Capture failed: log the first time, note it on the record, let the user's run go on."""
        if isinstance(exc, OverflowDetected):
            raise exc
        self.errors += 1
        if self.errors == 1:
            log.warning("opdiff: capture failed in %s (%s: %s); the run continues, affected "
                        "records carry an 'error' field", where, type(exc).__name__, exc)
        if record is not None:
            record["error"] = f"{where}: {type(exc).__name__}: {exc}"[:300]

    # -- steps -------------------------------------------------------------------------------
    def open_step(self) -> None:
        """Open this step's dump directory if the step and rank are selected (and the disk did
        not fill: then nothing more is recorded in this run, see sink.py)."""
        if self.sink.writer is not None or self.sink.stopped_by is not None:
            return
        cfg = self.config
        if cfg.step and self.step_index not in cfg.step:
            return
        rank = current_rank()
        if cfg.rank and rank not in cfg.rank:
            return
        from ..environment import fingerprint

        directory = layout.rank_dir(cfg.dump_path, self.step_index, rank)
        if (directory / layout.RECORDS).exists():
            # Never append to (or overwrite) an earlier run's dump: that would mix two runs.
            raise ConfigError(f"{directory} already holds a dump; choose another dump_path or remove it")
        meta = {"opdiff_version": __version__, "config": cfg.as_dict(), "step": self.step_index,
                "rank": rank, "environment": fingerprint(),
                # input descriptors name their producer (`"producer": [seq, slot]`, describe.py)
                "dataflow": 1}
        parallel = collectives.parallel_facts(self.model)   # ranks, TP styles (comparison/layouts)
        if parallel is not None:
            meta["parallel"] = parallel
        try:
            self.sink.open(directory, meta, cfg.task)
        except OSError as exc:
            if not disk_full(exc) and not self.opened:
                # a parent is a file, read-only or missing mount: the user's to fix, at once
                raise ConfigError(f"cannot write a dump into {directory} ({exc.strerror or exc}); "
                                  f"choose a writable dump_path") from None
            self.sink.stopped_by = exc      # later in a run, or a full disk: training goes on
            log.warning("opdiff: cannot write a dump into %s (%s); opdiff records nothing more "
                        "in this run, and the training goes on untouched", directory,
                        exc.strerror or exc)
            return
        self.opened = True
        if self.buffers:      # dataflow through unrecorded views and compiled buffers
            cast("Describer", self.sink.describer).buffers = True
        if cfg.task == "overflow_check":
            from .describe import Describer
            from .overflow import OverflowMonitor
            self.overflow = OverflowMonitor(self, Describer(self.sink.stats, self.sink.writer, save=True))

    def close_step(self) -> None:
        """Flush and close this step's dump; counters restart for the next step."""
        self.sink.flush_param_grads()
        self.sink.flush(last=True)
        self.sink.close_writer()
        for undo in self.at_close:   # let this step's graphs go; leaves forget its hooks
            undo()
        self.at_close.clear()
        self.sink.end()
        self.leaves.end_step()
        self.selection.reset()
        self.step_index += 1

    def close_writer(self) -> None:
        """Close this step's dump now (overflow_check stops training mid-step)."""
        self.sink.close_writer()

    # -- the call protocol of every layer (api.py, aten.py, modules.py) ------------------------
    def begin(self, name: str, op: str, kind: str, phase: str, index: int,
              stack: int | None) -> PendingRecord:
        """A call selected for recording begins: its pending record, which the layer fills with
        its inputs before the call, `finish` completes after it, and backward.py's hooks take
        for the call's backward record."""
        return PendingRecord({"name": name, "op": op, "kind": kind, "phase": phase,
                              "module": self.modules.current, "stack": stack}, index)

    def finish(self, pending: PendingRecord, result, inputs, *, kwargs: dict | None = None,
               parameters: dict | None = None, uninitialized: bool = False,
               emit: bool = True) -> None:
        """The call returned `result`: its outputs described (an `uninitialized` result by dtype
        and shape only), for a module call its keyword arguments before them and its
        `parameters` after, the record emitted (when `emit`), and the overflow check run on
        the call's `inputs` and result. Never raises into the user's call (see `fail`)."""
        record = pending.record
        name = record["name"]
        with self.own():    # (each part on its own: one that fails leaves the others described)
            if kwargs:
                try:
                    record["kwargs"] = {k: self.describe(v, name, Role.INPUT, k) for k, v in kwargs.items()}
                except Exception as exc:
                    self.fail(pending, exc)
            try:
                if uninitialized:
                    record["outputs"] = [self.unread(result, name, Role.OUTPUT, 0, "uninitialized")]
                else:
                    record["outputs"] = self.describe_all(
                        result if isinstance(result, (tuple, list)) else [result], name, Role.OUTPUT)
            except Exception as exc:
                record.setdefault("outputs", [])
                self.fail(pending, exc)
            if parameters is not None:
                try:
                    described = record["parameters"] = {
                        n: self.describe(p, name, Role.PARAMETERS, n) for n, p in parameters.items()
                        if p is not None}
                    tag_leaves(self, ((p, described[n]) for n, p in parameters.items() if p is not None),
                               record)
                except Exception as exc:
                    self.fail(pending, exc)
        try:
            if emit:
                self.emit(record)
            self.check_overflow(record, inputs, result, pending.inputs_finite)
        except Exception as exc:
            self.fail(pending, exc)

    # -- names and filters ---------------------------------------------------------------------
    def follow_buffers(self) -> None:
        """From now on, a tensor not found by identity is found by its data address and version
        (Inductor's kernels write through raw pointers and their readers get fresh views)."""
        self.leaves.follow_storage()        # (and the views it makes of the parameters)
        if not self.buffers:
            self.buffers = True
            if self.sink.describer is not None:
                cast("Describer", self.sink.describer).buffers = True

    def next_index(self, op: str) -> int:
        return self.sink.next_index(op)

    def selected(self, name: str, forward_selected: bool = False) -> bool:
        """Apply `scope` and `list` to a record name (see Selection.selected)."""
        return self.selection.selected(name, forward_selected)

    def stack_id(self, skip: int = 2, frames: tuple | None = None) -> int | None:
        """The stack id of the user's call site, `skip` frames above the caller (or of these
        user `frames`, see stacks.frames_from)."""
        if self.sink.writer is None:
            return None
        if frames is None:
            frames = stacks.user_frames(skip + 1, anchor=self.modules.anchor)
        return self.sink.stack_id(frames)

    # -- records -------------------------------------------------------------------------------
    def describe(self, value, name: str, role: str, slot) -> dict:
        """One value's descriptor in record `name` (see Describer.describe); a step is open."""
        return cast("Describer", self.sink.describer).describe(value, name, role, slot)

    def unread(self, value, name: str, role: str, slot, why: str = "overwritten") -> dict:
        """A value by dtype and shape only (see Describer.unread); a step is open."""
        return cast("Describer", self.sink.describer).unread(value, name, role, slot, why)

    def forget(self, values) -> None:
        """An op is about to overwrite `values`: what was described of them is stale."""
        cast("Describer", self.sink.describer).forget(values)

    def written_unseen(self, values) -> None:
        """Code capture does not see may have written `values` (see Describer.written_unseen)."""
        describer = self.sink.describer
        if describer is not None:
            cast("Describer", describer).written_unseen(values)

    def new_epoch(self) -> None:
        """User code may have run since the last op: descriptions cached before are checked
        again when read (see handles.py)."""
        cast("Describer", self.sink.describer).epoch += 1

    def describe_all(self, values, name: str, role: str) -> list:
        d = cast("Describer", self.sink.describer)   # set while a step is open
        return [d.describe(v, name, role, i) for i, v in enumerate(values)]

    def describe_inputs(self, op: str, args, kwargs, name: str,
                        record: dict | None = None) -> tuple[list, dict | None]:
        """An op's arguments before it runs; those it overwrites without reading (the target
        of a fill or copy_, an `out=` tensor) by dtype and shape only (see ops.OpTraits).
        With `record` (the op's), leaves among the arguments are tagged and recorded at their
        first read (see leaves.py)."""
        cast("Describer", self.sink.describer).epoch += 1   # user code may have run since the last op
        inputs, described = self._describe_inputs(op, args, kwargs, name)
        if record is not None and (self.leaves.table or self.leaves.has_inputs):
            tag_leaves(self, zip(args, inputs), record)
            if described is not None:
                tag_leaves(self, ((v, described[k]) for k, v in kwargs.items()), record)
        return inputs, described

    def _describe_inputs(self, op: str, args, kwargs, name: str) -> tuple[list, dict | None]:
        d = cast("Describer", self.sink.describer)   # set while a step is open
        overwrites = ops.traits(op).overwrites_first
        if args and overwrites:
            inputs = [d.unread(args[0], name, Role.INPUT, 0)] + \
                [d.describe(v, name, Role.INPUT, i) for i, v in enumerate(args[1:], 1)]
        else:
            inputs = [d.describe(v, name, Role.INPUT, i) for i, v in enumerate(args)]
        if not kwargs:
            return inputs, None
        # the first argument passed by keyword (torch.nn.init's initialisers, through
        # __torch_function__, pass theirs as `tensor=`)
        first = next((k for k in _FIRST_KEYWORDS if k in kwargs), None) if overwrites and not args else None
        return inputs, {k: (d.unread if k in ("out", first) else d.describe)(v, name, Role.INPUT, k)
                        for k, v in kwargs.items()}

    def check_overflow(self, record: dict, inputs, outputs, inputs_finite: bool | None = None) -> None:
        """task="overflow_check": find ops that create inf/NaN (see overflow.py)."""
        if self.overflow is not None and self.sink.writer is not None:
            self.overflow.check(record, inputs, outputs, inputs_finite)

    def emit(self, record: dict, force: bool = False) -> None:
        """Queue a finished record (see StepSink.emit)."""
        self.sink.emit(record, force)

    def flush(self, wait_for_tensors: bool = False) -> None:
        self.sink.flush(wait_for_tensors)

    def add_param_grad(self, module_op: str, expected: int, pname: str, grad) -> None:
        """Collect one parameter's gradient (see StepSink.add_param_grad)."""
        self.sink.add_param_grad(module_op, expected, pname, grad)


def current_rank() -> int:
    """torch.distributed's rank when initialised, else 0."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    return 0


__all__ = ["Session", "current_rank", "normalize_name", "name_matches"]
