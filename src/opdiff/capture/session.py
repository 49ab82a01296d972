"""The capture session: names ops, builds records, filters them, and hands them to the writer.

One Session serves one PrecisionDebugger. The interception pieces (`api.py`, `modules.py`,
`aten.py`) call into it; everything they do is guarded so that a failure inside capture is
logged once, recorded on the op, and never raised into the user's code.
"""
from __future__ import annotations

import gc
import logging
import re
import threading

import torch

from .. import __version__
from ..config import DumpConfig
from ..store import layout
from ..store.writer import DumpWriter
from . import naming, stacks
from .describe import Describer
from .stats import StatsBatch

log = logging.getLogger("opdiff")

_LEGACY = re.compile(r"^(Tensor|Torch|Functional|VF|NPU|Distributed|Aten)_(.+?)_(?:(\d+)_)?(forward|backward)$")
_COUNTER = re.compile(r"\.\d+\.(forward|backward)$")


def normalize_name(pattern: str) -> str:
    """ptdbg_ascend's `Tensor___iadd___0_forward` -> `Tensor.__iadd__.0.forward` (others unchanged)."""
    m = _LEGACY.match(pattern)
    if not m:
        return pattern
    prefix, api, index, phase = m.groups()
    return f"{prefix}.{api}.{index}.{phase}" if index is not None else f"{prefix}.{api}.{phase}"


def name_matches(pattern: str, name: str) -> bool:
    """A `list`/`scope` entry matches a record name exactly, without its counter, or as a substring."""
    pattern = normalize_name(pattern)
    if pattern == name or pattern in name:
        return True
    return _COUNTER.sub(r".\1", name) == pattern


class _Internal:
    """`with session.internal():` no grad, no torch-function modes (opdiff's own reductions must
    not be recorded or traced), and the thread marked busy. A plain class: this is entered
    about four times per recorded op, where a generator-based context manager costs more than
    the work it guards."""

    __slots__ = ("local", "busy", "grad", "no_modes")

    def __init__(self, local):
        self.local = local

    def __enter__(self):
        self.busy = getattr(self.local, "busy", False)
        self.local.busy = True
        self.grad = torch.is_grad_enabled()
        # Modes off first: _set_grad_enabled itself goes through torch-function modes.
        self.no_modes = torch._C.DisableTorchFunction()
        self.no_modes.__enter__()
        torch._C._set_grad_enabled(False)
        return self

    def __exit__(self, *exc_info):
        torch._C._set_grad_enabled(self.grad)
        self.no_modes.__exit__(None, None, None)
        self.local.busy = self.busy
        return False


class Session:
    """State of one debugger: current step, counters, open writer, pending records."""

    def __init__(self, config: DumpConfig):
        self.config = config
        self.step_index = 0
        self.writer: DumpWriter | None = None
        self.describer: Describer | None = None
        self.stats = StatsBatch()
        self.counters: dict[str, int] = {}
        self.seq = 0
        self.pending: list[dict] = []
        self.local = threading.local()
        self.lock = threading.RLock()
        self.errors = 0
        self._scope_state = "before" if config.scope else "inside"
        self._scope_closing = None      # the module call whose return ends the scope
        self.overflow = None            # set by the overflow_check task (see overflow.py)
        self.param_grads: dict = {}     # module name -> {"params": {...}, "expected": n}
        self.at_close: list = []        # undo at step close: hooks on leaves, nodes held (backward.py)
        self._frozen = False            # objects older than the step kept out of full GCs
        modes = set(config.data_mode)
        self.want_forward = "all" in modes or "forward" in modes or not ({"forward", "backward"} & modes)
        self.want_backward = "all" in modes or "backward" in modes or not ({"forward", "backward"} & modes)
        self.want_input = "all" in modes or "input" in modes or not ({"input", "output"} & modes)
        self.want_output = "all" in modes or "output" in modes or not ({"input", "output"} & modes)

    # -- guards ------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return getattr(self.local, "busy", False)

    def internal(self) -> "_Internal":
        """Mark opdiff's own tensor work so the interception layers do not record it."""
        return _Internal(self.local)

    def failed(self, where: str, exc: BaseException, record: dict | None = None) -> None:
        """Capture failed: log the first time, note it on the record, let the user's run go on."""
        from ..errors import OverflowDetected
        if isinstance(exc, OverflowDetected):
            raise exc
        self.errors += 1
        if self.errors == 1:
            log.warning("opdiff: capture failed in %s (%s: %s); the run continues, affected "
                        "records carry an 'error' field", where, type(exc).__name__, exc)
        if record is not None:
            record["error"] = f"{where}: {type(exc).__name__}: {exc}"[:300]

    # -- steps -------------------------------------------------------------------------------
    @property
    def recording(self) -> bool:
        return self.writer is not None

    def open_step(self) -> None:
        """Open this step's dump directory if the step and rank are selected."""
        if self.writer is not None:
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
            from ..errors import ConfigError
            raise ConfigError(f"{directory} already holds a dump; choose another dump_path or remove it")
        meta = {"opdiff_version": __version__, "config": cfg.as_dict(), "step": self.step_index,
                "rank": rank, "environment": fingerprint()}
        try:
            self.writer = DumpWriter(directory, meta)
        except OSError as exc:  # a parent is a file, read-only or missing mount: the user's to fix
            from ..errors import ConfigError
            raise ConfigError(f"cannot write a dump into {directory} ({exc.strerror or exc}); "
                              f"choose a writable dump_path") from None
        self._frozen = _freeze_older_objects()
        light = cfg.task == "overflow_check"
        self.describer = Describer(None if light else self.stats, self.writer, save=cfg.task == "tensor")
        if light:
            from .overflow import OverflowMonitor
            self.overflow = OverflowMonitor(self, Describer(self.stats, self.writer, save=True))

    def close_step(self) -> None:
        """Flush and close this step's dump; counters restart for the next step."""
        self.flush_param_grads()
        self.flush()
        self.close_writer()
        self.describer = None
        for undo in self.at_close:   # let this step's graphs go; leaves forget its hooks
            undo()
        self.at_close.clear()
        self.counters.clear()
        self.seq = 0
        self.__dict__.pop("_stack_cache", None)   # stack ids belong to the closed step's writer
        self._scope_state = "before" if self.config.scope else "inside"
        self._scope_closing = None
        self.step_index += 1

    def close_writer(self) -> None:
        """Close this step's dump, and give the objects frozen at its start back to the garbage
        collector (also when overflow_check stops training mid-step, never to close it)."""
        if self.writer is not None:
            self.writer.close()
        self.writer = None
        if self._frozen:
            gc.unfreeze()
            self._frozen = False

    # -- names and filters ---------------------------------------------------------------------
    def next_index(self, op: str) -> int:
        n = self.counters.get(op, 0)
        self.counters[op] = n + 1
        return n

    def selected(self, name: str, forward_selected: bool = False) -> bool:
        """Apply `scope` and `list` to a record name (counters advance either way).

        `forward_selected`: the name is the backward of a forward record just selected. It is in
        scope because its forward is (the scope may have closed at that very forward), and it
        must not move the scope's state.
        """
        cfg = self.config
        if cfg.scope and not forward_selected:
            first, last = cfg.scope
            if self._scope_state == "before" and name_matches(first, name):
                self._scope_state = "inside"
            if self._scope_state != "inside":
                return False
            if name_matches(last, name):
                if name.startswith("Module.") and ".forward." in name:
                    # A module closes the scope when it returns: its own ops are in the range.
                    self._scope_closing = name
                else:
                    self._scope_state = "after"
                return True
        if cfg.list:
            return any(name_matches(p, name) for p in cfg.list)
        return True

    def module_returned(self, name: str) -> None:
        """A module call ended: if it is the scope's last entry, the scope closes now."""
        if self._scope_closing == name:
            self._scope_state = "after"
            self._scope_closing = None

    def stack_id(self, skip: int = 2) -> int | None:
        if not self.config.stack or self.writer is None:
            return None
        frames = stacks.user_frames(skip + 1)
        cache = self.__dict__.setdefault("_stack_cache", {})
        sid = cache.get(frames)
        if sid is None:
            sid = self.writer.stack_id(stacks.with_source(frames))
            cache[frames] = sid
        return sid

    # -- records -------------------------------------------------------------------------------
    def describe_all(self, values, name: str, role: str) -> list:
        return [self.describer.describe(v, f"{name}.{role}.{i}") for i, v in enumerate(values)]

    def describe_inputs(self, op: str, args, kwargs, name: str) -> tuple[list, dict | None]:
        """An op's arguments before it runs; those it overwrites without reading (the target
        of a fill or copy_, an `out=` tensor) by dtype and shape only (see naming.overwrites_first)."""
        d = self.describer
        if args and naming.overwrites_first(op):
            inputs = [d.unread(args[0], f"{name}.input.0")] + \
                [d.describe(v, f"{name}.input.{i}") for i, v in enumerate(args[1:], 1)]
        else:
            inputs = [d.describe(v, f"{name}.input.{i}") for i, v in enumerate(args)]
        if not kwargs:
            return inputs, None
        return inputs, {k: (d.unread if k == "out" else d.describe)(v, f"{name}.input.{k}")
                        for k, v in kwargs.items()}

    def check_overflow(self, record: dict, inputs, outputs) -> None:
        """task="overflow_check": find ops that create inf/NaN (see overflow.py)."""
        if self.overflow is not None and self.writer is not None:
            self.overflow.check(record, inputs, outputs)

    def emit(self, record: dict, force: bool = False) -> None:
        """Queue a finished record; statistics are resolved in a batch at flush."""
        if self.writer is None or (self.overflow is not None and not force):
            return
        record["seq"] = self.seq
        self.seq += 1
        if not self.want_input:
            record.pop("inputs", None)
            record.pop("kwargs", None)
        if not self.want_output:
            record.pop("outputs", None)
        self.pending.append(record)
        if len(self.pending) >= 256:
            self.flush()

    def flush(self, wait_for_tensors: bool = False) -> None:
        if not self.pending and not len(self.stats):
            if wait_for_tensors and self.writer is not None:
                self.writer.flush(wait_for_tensors=True)
            return
        with self.internal():
            try:
                self.stats.resolve()
            except Exception as exc:
                self.failed("statistics", exc)
                for record in self.pending:
                    record.setdefault("error", f"statistics: {type(exc).__name__}: {exc}"[:300])
        writer = self.writer
        for record in self.pending:
            if writer is not None:
                writer.write(record)
        self.pending.clear()
        if writer is not None:
            writer.flush(wait_for_tensors=wait_for_tensors)

    # -- parameter gradients -------------------------------------------------------------------
    def add_param_grad(self, module_name: str, expected: int, pname: str, grad) -> None:
        """Collect one parameter's gradient; a module's record is emitted once all have arrived."""
        entry = self.param_grads.setdefault(module_name, {})
        entry[pname] = grad
        if len(entry) >= expected:
            self._emit_param_grads(module_name)

    def _emit_param_grads(self, module_name: str) -> None:
        grads = self.param_grads.pop(module_name, None)
        if not grads or self.writer is None:
            return
        op = f"{module_name}.parameters_grad"
        name = f"{op}.{self.next_index(op)}"
        if not self.want_backward or not self.selected(name):
            return
        record = {"name": name, "op": op, "kind": "param_grad", "phase": "backward", "module": None,
                  "parameters": {}, "stack": None}
        with self.internal():
            try:
                record["parameters"] = {p: self.describer.describe(g, f"{name}.{p}")
                                        for p, g in grads.items()}
            except Exception as exc:
                self.failed("parameter gradients", exc, record)
        self.emit(record)

    def flush_param_grads(self) -> None:
        for module_name in list(self.param_grads):
            self._emit_param_grads(module_name)


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


def current_rank() -> int:
    """torch.distributed's rank when initialised, else 0."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    return 0
