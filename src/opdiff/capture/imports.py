"""Run a function once a module is imported, without importing it.

Capture hooks into parts of torch that a run may never use: Inductor's code cache and C++
code generator (`capture/inductor.py`, `capture/kernel_programs.py`) cost about a second to
import, and only a run that calls `torch.compile` imports them (`torch.compile(...)` itself
does). So a layer asks

    waiting = after_import("torch._inductor.codecache", hook)   # hook(module), now or later
    ...
    waiting.cancel()                                              # when the layer stops

and `hook` runs at once if the module is already imported, or right after the module's code has
run when the program imports it later, for example at the first `torch.compile` call inside the
debugger's window. Nothing of the module changes: its loader runs as it would, and the finder
that waits for it leaves `sys.meta_path` once nothing waits.
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("opdiff")
Hook = Callable[[Any], None]


class Waiting:
    """A hook waiting for its module (`after_import`); `cancel()` takes it back."""

    def __init__(self, name: str, hook: Hook) -> None:
        self.name, self.hook = name, hook

    def cancel(self) -> None:
        _finder.remove(self)


class _AfterImport:
    """The `sys.meta_path` finder that runs the hooks of a module after it is executed. It finds
    nothing itself: it asks the finders after it for the module's spec, and wraps that spec's
    loader's `exec_module` (an attribute of that one loader object)."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Waiting]] = {}
        self.lock = threading.Lock()

    def add(self, waiting: Waiting) -> None:
        with self.lock:
            self.waiting.setdefault(waiting.name, []).append(waiting)
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def remove(self, waiting: Waiting) -> None:
        with self.lock:
            hooks = self.waiting.get(waiting.name, [])
            if waiting in hooks:
                hooks.remove(waiting)
            if not hooks:
                self.waiting.pop(waiting.name, None)
            if not self.waiting and self in sys.meta_path:
                sys.meta_path.remove(self)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Optional[Any]:
        if name not in self.waiting:
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        loader: Any = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if spec is None or run is None:
            return spec
        finder = self

        def exec_module(module: Any) -> None:
            run(module)
            with finder.lock:     # (each hook runs once)
                hooks = finder.waiting.pop(name, [])
                if not finder.waiting and finder in sys.meta_path:
                    sys.meta_path.remove(finder)
            for waiting in hooks:
                _call(waiting, module)
        try:
            loader.exec_module = exec_module
        except AttributeError:      # a loader that takes no attribute: the hook does not run
            pass
        return spec


def _call(waiting: Waiting, module: Any) -> None:
    try:
        waiting.hook(module)
    except Exception as exc:    # a hook never breaks the user's import
        log.warning("opdiff could not hook into %s: %s", waiting.name, exc)


_finder = _AfterImport()


def after_import(name: str, hook: Hook) -> Waiting:
    """Run `hook(module)` now if module `name` is imported, else once it is (see the module
    docstring). Returns what `cancel()` takes back; a hook that ran has nothing to take back."""
    waiting = Waiting(name, hook)
    module = sys.modules.get(name)
    if module is not None:
        _call(waiting, module)
    else:
        _finder.add(waiting)
    return waiting


__all__ = ["Waiting", "after_import"]
