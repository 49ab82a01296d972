"""Start-up of a process under `opdiff run`: wait for torch, then install autorun.py's hooks.

Imported by `launch/site/sitecustomize.py` in every process the launch starts (and called
directly by `opdiff run` for a script it runs in its own process). A process that never
imports torch (a shell helper, a tokenizer server) pays one environment lookup and one import
finder that looks at the name of each top-level import until torch comes.
"""
from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any, Optional, Sequence

from . import ENV

_installed: list[Any] = []


def install() -> None:
    """Install the hooks now if torch is imported, else as soon as it is (idempotent)."""
    if _installed or not os.environ.get(ENV):
        return
    _installed.append(True)
    if "torch" in sys.modules and hasattr(sys.modules["torch"], "optim"):
        _torch_ready()
    else:
        sys.meta_path.insert(0, _TorchWatcher())


def _torch_ready() -> None:
    try:
        from .autorun import Autorun, say
        from .settings import RunSettings

        settings = RunSettings.from_env()
        if settings is None:
            return
        try:
            runner = Autorun(settings)
        except Exception as exc:  # noqa: BLE001 - a ConfigError the command could not see
            say("settings", f"{exc}; this process runs without capture")
            return
        runner.install()
        _installed.append(runner)
        os.register_at_fork(after_in_child=runner.forked)
    except Exception as exc:  # noqa: BLE001 - the user's program runs on regardless
        sys.stderr.write(f"opdiff run: could not install its hooks ({type(exc).__name__}: {exc}); "
                         f"this process runs without capture\n")


def runner() -> Any:
    """This process's Autorun (None before torch is imported or without OPDIFF_RUN_CONFIG)."""
    return _installed[1] if len(_installed) > 1 else None


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch` is imported, wraps its loader to call `_torch_ready`
    once torch's own initialisation is complete, then leaves sys.meta_path."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            _torch_ready()

        loader.exec_module = exec_then_install
        return spec


__all__ = ["install", "runner"]
