"""Worker processes die with the process that started them.

A compare or check killed by SIGTERM or SIGKILL (a CI timeout, Ctrl-C of a wrapper, the OOM
killer) must not leave its pool workers behind: they would go on replaying for minutes, write
into the spool and hold the caller's stdout open. Every pool opdiff starts (the compare's pair
workers in `comparison/runs.py`, the replay's in `comparison/replay`, the check's in
`check/runner.py`) runs `watch_parent` first in each worker:

    ProcessPoolExecutor(..., initializer=watch_parent, initargs=(os.getpid(),))

A daemon thread in the worker looks every `INTERVAL` seconds whether its parent is still the
process that started it (`os.getppid()`; a dead parent's children are handed to init or a
subreaper) and ends the worker at once (`os._exit`) when it is not. Polling works on every
platform and wherever the pool was created. Linux's PR_SET_PDEATHSIG is not used: it fires when
the *thread* that forked the worker exits, and a pool is grown from whichever thread submits to
it (`Replayer` keeps its pool across calls), so it would kill healthy workers.
"""
from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Any, Callable, Optional

INTERVAL = 0.25      # seconds between looks at the parent


def _parent_alive(parent: int) -> bool:
    return os.getppid() == parent


def watch_parent(parent: int, init: "Optional[Callable[..., Any] | str]" = None,
                 *args: Any) -> None:
    """In a worker: end this process as soon as `parent` (the pid that started it) is gone,
    then run `init(*args)` (the pool's own initializer) when given. `init` may be named as
    "module:function": it is then imported after the watch has begun (a worker importing torch
    takes seconds, and a function passed itself is imported before any initializer runs)."""
    if not _parent_alive(parent):     # it died while this worker started
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(INTERVAL)
            if not _parent_alive(parent):
                os._exit(1)           # no cleanup: the parent that would use it is gone

    threading.Thread(target=watch, name="opdiff-parent-watch", daemon=True).start()
    run: Optional[Callable[..., Any]]
    if isinstance(init, str):
        module, _, name = init.partition(":")
        run = getattr(importlib.import_module(module), name)
    else:
        run = init
    if run is not None:
        run(*args)


__all__ = ["watch_parent", "INTERVAL"]
