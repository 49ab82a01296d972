"""The module call chain of the current thread, as `torch.utils.module_tracker.ModuleTracker`
keeps it: which module calls are running, innermost last.

The module layer (modules.py) pushes a call when a module's forward begins and pops it when it
returns; every record made meanwhile names the innermost call as its `module`:

    stack = ModuleStack()
    stack.push(module, "Module.fc.Linear.forward.0", state)
    stack.current                  # "Module.fc.Linear.forward.0"
    stack.pop(module)              # state, or None when `module` is not the innermost call
"""
from __future__ import annotations

import threading


class ModuleStack:
    """Per-thread stack of running module calls: (module, record name, caller's state)."""

    __slots__ = ("_local",)

    def __init__(self):
        self._local = threading.local()

    def _calls(self) -> list:
        calls = getattr(self._local, "calls", None)
        if calls is None:
            calls = self._local.calls = []
            self._local.names = []
            self._local.anchors = []
        return calls

    @property
    def current(self) -> str | None:
        """The record name of the innermost running module call (None outside any)."""
        names = getattr(self._local, "names", None)
        return names[-1] if names else None

    @property
    def anchor(self) -> tuple | None:
        """The innermost running call's (frame, user frames from it outward), or None (see
        stacks.user_frames)."""
        anchors = getattr(self._local, "anchors", None)
        return anchors[-1] if anchors else None

    def push(self, module, name: str, state, anchor: tuple | None = None) -> None:
        """A call of `module` began; `state` comes back from `pop`. `anchor`: the frame that
        runs the call and the user frames from it outward (None: not known)."""
        self._calls().append((module, state))
        self._local.names.append(name)
        self._local.anchors.append(anchor)

    def pop(self, module):
        """The state pushed with `module`'s call, if it is the innermost one; else None (and
        the stack is left as it is: a hook of a call this stack never saw)."""
        calls = getattr(self._local, "calls", None)
        if not calls or calls[-1][0] is not module:
            return None
        self._local.names.pop()
        self._local.anchors.pop()
        return calls.pop()[1]
