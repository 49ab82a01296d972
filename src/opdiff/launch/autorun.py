"""In each process of `opdiff run`: find the model and the step boundaries, start and stop the
debugger (or the monitor) there. Installed by bootstrap.py once torch is imported.

A step is what happens between two optimizer steps, seen through torch's global optimizer
hooks: it begins at the first module call after the previous step (the outermost forward,
through a global forward pre-hook that is registered only while a step to record is due and
removed at once) and ends at the post-hook of the optimizer step that completes it: with
several optimizers, when each one created so far has stepped (one that steps twice first shows
the others are not part of the loop); forwards without an optimizer step between them
(gradient accumulation) stay in one step. A program that creates no torch.optim optimizer
before its first forward counts each call of the first module called as one step.

The model is the module whose parameters the optimizer updates: the first module called when
it holds any of them (a DDP or FSDP wrapper, as the user calls it), else the one `--model`
names. Whatever cannot be found is said in one line on stderr, and training goes on: nothing
here raises into the user's program.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from typing import Any, Optional

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from .settings import RunSettings

_said: set[str] = set()


def say(key: str, text: str) -> None:
    """One line on stderr, once per process."""
    if key not in _said:
        _said.add(key)
        sys.stderr.write(f"opdiff run: {text}\n")
        sys.stderr.flush()


def _rank() -> int:
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001 - no process group: rank 0
        pass
    return 0


class Autorun:
    """The hooks of one process (see the module docstring)."""

    def __init__(self, settings: RunSettings):
        self.settings = settings
        self.config = settings.debugger_config() if settings.monitor is None else None
        self.step = 0
        self.began = False                    # the current step's first forward ran
        self.dbg: Any = None
        self.monitor: Any = None
        self.model: Optional[weakref.ref] = None
        self.by_forward: Any = None           # the model's pre-hook when no optimizer bounds steps
        self.optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.stepped: set[int] = set()        # ids of the optimizers that stepped in this step
        self.idle: set[int] = set()           # ids of optimizers created but not stepping
        self.arm_handle: Any = None
        self.handles: list[Any] = []
        self.done = False
        self.off = False                      # the control file said: record nothing now
        self.control_stamp: Any = None
        self.written: list[int] = []          # the steps this process wrote, for the last word

    # -- installation ------------------------------------------------------------------------
    def install(self) -> None:
        runner = self

        original = optim_module.Optimizer.__init__

        def init(opt: Any, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            runner.optimizers.add(opt)

        init.__wrapped__ = original  # type: ignore[attr-defined]
        optim_module.Optimizer.__init__ = init  # type: ignore[assignment]
        self._restore_init = lambda: setattr(optim_module.Optimizer, "__init__", original)
        self.handles.append(optim_module.register_optimizer_step_pre_hook(self._before_opt_step))
        self.handles.append(optim_module.register_optimizer_step_post_hook(self._after_opt_step))
        self._poll()
        self._arm()
        atexit.register(self.close)

    def uninstall(self) -> None:
        """Nothing more to record: every hook goes, training runs as without opdiff."""
        self.done = True
        self._disarm()
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if self.by_forward is not None:
            self.by_forward.remove()
            self.by_forward = None
        self._restore_init()

    def forked(self) -> None:
        """In a forked child (a DataLoader worker): the parent records, the child does not."""
        try:
            self.dbg = None
            self.monitor = None
            self.uninstall()
        except Exception:  # noqa: BLE001
            pass

    def _wanted(self, step: int) -> bool:
        if self.monitor is not None or self.settings.monitor is not None:
            return True
        if self.off:
            return False
        steps = self.config.step if self.config is not None else []
        return not steps or step in steps

    def _more_to_come(self) -> bool:
        if self.settings.monitor is not None or self.settings.control:
            return True
        steps = self.config.step if self.config is not None else []
        return not steps or self.step <= max(steps)

    def _arm(self) -> None:
        if self.arm_handle is None and self.by_forward is None and self._wanted(self.step):
            self.arm_handle = nn_module.register_module_forward_pre_hook(self._first_forward)

    def _disarm(self) -> None:
        if self.arm_handle is not None:
            self.arm_handle.remove()
            self.arm_handle = None

    # -- the step's first forward ------------------------------------------------------------
    def _first_forward(self, module: Any, args: tuple) -> None:
        try:
            if self.settings.model and type(module).__name__ != self.settings.model:
                return None                   # not the model --model names: wait for it
            self._disarm()
            if self.by_forward is None and not self._live_optimizers():
                self._bound_by_forward(module)
            self._begin(module, args)
        except Exception as exc:  # noqa: BLE001 - never into the user's training
            self._failed(exc)
        return None

    def _bound_by_forward(self, module: Any) -> None:
        say("no-optimizer", f"no torch.optim optimizer was created before the first forward; "
                            f"each call of {type(module).__name__} counts as one step (create "
                            f"the optimizer first, or use a callback, to count optimizer steps)")
        self.model = weakref.ref(module)

        def boundary(mod: Any, args: tuple) -> None:
            try:
                if self.began:
                    # torch took this call's pre-hooks before this one ran: the ended step's
                    # input hook (with kwargs) is still called once, so it must stay marked as
                    # such, and the next step gets a debugger of its own.
                    marked = set(getattr(mod, "_forward_pre_hooks_with_kwargs", ()))
                    self._end_step()
                    self.dbg = None
                    for hid in marked - set(getattr(mod, "_forward_pre_hooks_with_kwargs", ())):
                        mod._forward_pre_hooks_with_kwargs[hid] = True
                if self.done:
                    return
                if self._wanted(self.step):
                    self._begin(mod, args)
                else:
                    self.began = True
            except Exception as exc:  # noqa: BLE001
                self._failed(exc)

        self.by_forward = module.register_forward_pre_hook(boundary, prepend=True)

    def _live_optimizers(self) -> list[Any]:
        return [o for o in list(self.optimizers) if any(g["params"] for g in o.param_groups)]

    def _choose_model(self, module: Any) -> Any:
        known = self.model() if self.model is not None else None
        if known is not None:
            return known
        trained = {id(p) for o in self._live_optimizers() for g in o.param_groups for p in g["params"]}
        if trained and not any(id(p) in trained for p in module.parameters()):
            say("model", f"the first module called in step {self.step} ({type(module).__name__}) "
                         f"holds none of the parameters the optimizer updates; it is recorded as "
                         f"the model (name the model's class with --model CLASS)")
        else:
            self.model = weakref.ref(module)
        return module

    def _begin(self, module: Any, args: tuple) -> None:
        self.began = True
        model = self._choose_model(module)
        if self.settings.monitor is not None:
            self._begin_monitor(model)
            return
        config = self.config
        assert config is not None
        if config.rank and _rank() not in config.rank:
            return
        if self.dbg is None:
            from ..capture.debugger import PrecisionDebugger

            self.dbg = PrecisionDebugger(**config.as_dict())
        self.dbg.session.step_index = self.step
        global_before = set(nn_module._global_forward_pre_hooks)
        local_before = set(module._forward_pre_hooks)
        self.dbg.start(model)
        # This call's pre-hooks were gathered before start() added its own: run those now.
        for hid, hook in list(nn_module._global_forward_pre_hooks.items()):
            if hid not in global_before:
                hook(module, args)
        for hid, hook in list(module._forward_pre_hooks.items()):
            if hid not in local_before:
                with_kwargs = hid in getattr(module, "_forward_pre_hooks_with_kwargs", {})
                hook(module, args, {}) if with_kwargs else hook(module, args)

    def _begin_monitor(self, model: Any) -> None:
        if self.monitor is None:
            from ..monitor.monitor import Monitor

            opts = dict(self.settings.monitor or {})
            path = opts.pop("path")
            optimizers = self._live_optimizers()
            self.monitor = Monitor(model, path, optimizer=optimizers[0] if optimizers else None, **opts)

    # -- the step's end ----------------------------------------------------------------------
    def _before_opt_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            if id(opt) in self.stepped and self.began:
                # It steps again before the others did: they are not part of the loop.
                say("optimizers", "an optimizer stepped twice before another one stepped once; "
                                  "steps are counted by the optimizers that step")
                live = {id(o) for o in self._live_optimizers()}
                self.idle |= live - self.stepped
                self._end_step()
                self.began = True    # its forward and backward ran in the step that now begins
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)

    def _after_opt_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.by_forward is not None:         # an optimizer after all: it bounds the steps
                self.by_forward.remove()
                self.by_forward = None
            self.stepped.add(id(opt))
            live = {id(o) for o in self._live_optimizers()} - self.idle
            if live <= self.stepped:
                self._end_step()
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)

    def _end_step(self) -> None:
        if self.monitor is not None:
            self.monitor.step()
        if self.dbg is not None and self.dbg.session.recording:
            self.dbg.stop()
            self.dbg.step()
            self.written.append(self.step)
        self.step += 1
        self.began = False
        self.stepped.clear()
        self._poll()
        if not self._more_to_come():
            self.close()
            self.uninstall()
            return
        self._arm()

    def _poll(self) -> None:
        """Read the control file again when it changed (see settings.py); a file that cannot
        be read or makes no sense is said once and changes nothing."""
        path = self.settings.control
        if not path or self.config is None:
            return
        try:
            st = os.stat(path)
        except OSError:
            return                              # not there (yet): as configured
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.control_stamp:
            return
        self.control_stamp = stamp
        try:
            steps = json.loads(_read_control(path))["steps"]
            if not isinstance(steps, list) or not all(isinstance(x, int) and x >= 0 for x in steps):
                raise ValueError("'steps' must be a list of step numbers")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            say(f"control-{stamp}", f"control file {path}: {exc}; expected {{\"steps\": [120, 121]}}")
            return
        self.off = not steps
        self.config.step = sorted(set(steps))
        if self.dbg is not None:
            self.dbg.config.step = self.config.step

    def close(self) -> None:
        """Write what is open (at exit, or once the last configured step is done)."""
        try:
            if self.dbg is not None and self.dbg.session.recording:
                self.dbg.stop()
                self.dbg.step()
                self.written.append(self.step)
            if self.monitor is not None:
                self.monitor.close()
                self.monitor = None
                if _rank() == 0 and self.settings.monitor:
                    path = self.settings.monitor["path"]
                    say("wrote", f"monitored into {os.path.abspath(path)}; "
                                 f"read it with: opdiff trend {path} -o OUT")
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
        self._say_written()

    def _say_written(self) -> None:
        """Where this process wrote, once, by the lowest rank that records (one line for a
        run of any size, not one per rank)."""
        if not self.written or self.config is None:
            return
        rank, recorded = _rank(), list(self.config.rank or [])
        if rank != (min(recorded) if recorded else 0):
            return
        steps = sorted(set(self.written))
        ranks = "ranks " + ",".join(map(str, recorded)) if recorded else "every rank"
        path = self.config.dump_path
        say("wrote", f"wrote step{'s' if len(steps) > 1 else ''} {','.join(map(str, steps))} "
                     f"({ranks}) to {os.path.abspath(path)}; compare it with: "
                     f"opdiff compare {path} OTHER_DUMP")

    def _failed(self, exc: BaseException) -> None:
        from ..errors import OverflowDetected

        if isinstance(exc, OverflowDetected):
            raise exc                      # task="overflow_check" stops training on purpose
        say("failed", f"{type(exc).__name__}: {exc}; recording stops, training goes on")
        try:
            if self.dbg is not None and self.dbg.session.recording:
                self.dbg.stop()
                self.dbg.step()
        except Exception:  # noqa: BLE001
            pass
        self.uninstall()


MAX_CONTROL_BYTES = 1 << 20


def _read_control(path: str) -> bytes:
    """The control file's bytes, read in the training process without waiting or growing: a
    regular file only (a FIFO, a device such as /dev/zero or a link to one is refused, never
    opened for a blocking read: `store.dumpfiles.open_file`), at most MAX_CONTROL_BYTES."""
    from ..errors import DumpError
    from ..store import dumpfiles

    try:
        with dumpfiles.open_file(path) as f:
            raw = f.read(MAX_CONTROL_BYTES + 1)
    except DumpError as exc:
        raise ValueError(str(exc).replace("a dump holds only regular files",
                                          "a control file must be one")) from None
    if len(raw) > MAX_CONTROL_BYTES:
        raise ValueError(f"larger than {MAX_CONTROL_BYTES} bytes")
    return raw


__all__ = ["Autorun", "say"]
