"""PrecisionDebugger and opdiff.dump: the user-facing capture API.

    dbg = opdiff.PrecisionDebugger(dump_path="./dump/gpu", task="statistics", level="mix", step=[0, 1])
    for x, y in loader:
        dbg.start(model)
        loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
        dbg.stop()
        dbg.step()

    with opdiff.dump(model, "./dump/cpu", level="mix", task="tensor"):
        loss = model(x).sum(); loss.backward()
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Protocol

from ..config import DumpConfig
from ..errors import ConfigError
from .api import ApiCapture
from .aten import AtenCapture
from .inductor import InductorKernels
from .modules import ModuleCapture
from .session import Session

log = logging.getLogger("opdiff")



class Layer(Protocol):
    """One interception layer (modules.py, api.py, aten.py), made once per debugger from its
    session. `needs_model = True` on a layer that hooks a model's modules."""

    def start(self, model) -> None:
        """Begin intercepting (again, after a stop)."""

    def stop(self) -> None:
        """Stop intercepting; what it hooked for backward still fires until end_step."""

    def end_step(self) -> None:
        """The step is over: let go of what belongs to it."""


# Which interception layers each level installs.
LEVELS: dict[str, tuple[type[Layer], ...]] = {
    "L0": (ModuleCapture,),
    "L1": (ApiCapture,),
    "mix": (ModuleCapture, ApiCapture, InductorKernels),
    "L2": (AtenCapture, InductorKernels),
}

_active: "PrecisionDebugger | None" = None


def _needs_model(level: str) -> bool:
    """Whether a level installs a layer that hooks a model's modules."""
    return any(getattr(layer, "needs_model", False) for layer in LEVELS.get(level, ()))


class PrecisionDebugger:
    """Records every op of the steps you select into `dump_path/step{S}/rank{R}/`.

    Arguments are msprobe's: `dump_path`, `task` ("statistics" | "tensor" | "overflow_check"),
    `level` ("L0" modules | "L1" torch API | "mix" both | "L2" aten), `step` (list of steps to
    dump, [] = all), `rank`, `scope` ([first, last] op names), `list` (names or substrings),
    `data_mode` (["all"] or forward/backward/input/output), `overflow_nums`; or
    `config_path="config.json"` with msprobe's keys (arguments given here win).
    """

    def __init__(self, dump_path=None, task=None, level=None, step=None, rank=None, scope=None,
                 list=None, data_mode=None, overflow_nums=None, config_path=None, model=None,
                 **unknown):
        if unknown:
            raise ConfigError(f"PrecisionDebugger got an unknown argument '{sorted(unknown)[0]}'")
        options = dict(dump_path=dump_path, task=task, level=level, step=step, rank=rank,
                       scope=scope, list=list, data_mode=data_mode, overflow_nums=overflow_nums)
        if config_path is not None:
            self.config = DumpConfig.from_file(config_path, **options)
        else:
            self.config = DumpConfig.create(**{k: v for k, v in options.items() if v is not None})
        self.session = Session(self.config)
        self.model = model
        self._layers = [layer(self.session) for layer in LEVELS[self.config.level]]
        self._running = False

    # -- the three verbs -------------------------------------------------------------------------
    def start(self, model=None) -> None:
        """Begin (or resume) recording the current step. `model` is needed for L0 and mix."""
        global _active
        if self._running:
            return
        model = model if model is not None else self.model
        level = self.config.level
        if model is None and _needs_model(level):
            raise ConfigError(f"level '{level}' records modules: pass the model, dbg.start(model)")
        if _active is not None and _active is not self and _active.stopped_by_overflow:
            _active.stop()  # OverflowDetected ended the user's loop before it could call stop()
        if _active is not None and _active is not self:
            raise ConfigError("another opdiff debugger is running; stop it first")
        self.session.model = model      # (its layout over ranks goes into meta.json)
        self.session.open_step()
        if not self.session.recording:
            return  # this step or rank is not selected
        if model is not None:
            self.model = model
            if ApiCapture in LEVELS[level]:     # DDP's / FSDP2's gradient collectives, no opt-in
                from .collectives import record_backward_collectives
                record_backward_collectives(model)
            self.session.leaves.follow(model)
            self.session.leaves.hook_inputs()
        started = []
        try:
            for layer in self._layers:
                layer.start(model)
                started.append(layer)
        except BaseException:    # never leave half the hooks behind
            for layer in reversed(started):
                layer.stop()
            self.session.leaves.unhook()
            raise
        _active = self
        self._running = True

    def stop(self) -> None:
        """Pause recording. Backward hooks of ops already recorded still fire until `step()`."""
        global _active
        if not self._running:
            return
        for layer in reversed(self._layers):
            layer.stop()
        self.session.leaves.unhook()
        self.session.flush(wait_for_tensors=True)   # a crash after stop() loses nothing
        self._running = False
        _active = None
        if self.session.overflow is not None and not self.session.overflow.stopped:
            self.session.overflow.settle()   # may raise OverflowDetected for backward origins

    def step(self) -> None:
        """End the step: write everything of it to disk and reset the op counters."""
        if self._running:
            self.stop()
        for layer in self._layers:
            layer.end_step()
        self.session.close_step()

    def _let_go(self) -> None:
        """Remove the hooks a layer keeps between steps (module hooks: see modules.py); for
        `opdiff.dump`, which records one step."""
        for layer in self._layers:
            remove = getattr(layer, "remove", None)
            if remove is not None:
                remove()

    # -- conveniences -------------------------------------------------------------------------
    @property
    def dump_dir(self):
        """Where the current step is being written (None when this step is not recorded)."""
        w = self.session.writer
        return w.directory if w is not None else None

    @property
    def stopped_by_overflow(self) -> bool:
        """True once task="overflow_check" raised OverflowDetected."""
        mon = self.session.overflow
        return bool(mon is not None and mon.stopped)

    @property
    def overflows(self) -> list:
        """Origin records found so far by task="overflow_check"."""
        mon = self.session.overflow
        return list(mon.origins) if mon is not None else []


@contextmanager
def dump(model=None, dump_path: str = "./dump", *, level: str = "mix", task: str = "statistics",
         **options):
    """Record everything inside the block as one step.

        with opdiff.dump(model, "./dump/cpu", level="mix", task="tensor"):
            loss = model(x).sum(); loss.backward()

    Yields the PrecisionDebugger; the dump is complete when the block exits.
    """
    if model is None and _needs_model(level):
        level = "L1"  # nothing to hook at module level: API calls only
    dbg = PrecisionDebugger(dump_path=dump_path, level=level, task=task, **options)
    dbg.start(model)
    try:
        yield dbg
    finally:
        dbg.stop()
        dbg.step()
        dbg._let_go()
