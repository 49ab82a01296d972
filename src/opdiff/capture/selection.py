"""Which records of a step are kept: `scope` (a range of ops), `list` (names or substrings) and
`data_mode` (forward/backward, input/output), as msprobe's config.json spells them.

    sel = Selection(config)
    sel.selected("Functional.relu.0.forward")     # scope and list applied, scope state moved
    sel.module_returned("Module.fc.Linear.forward.0")
    sel.want_backward                              # data_mode
"""
from __future__ import annotations

from ..config import DumpConfig
from ..store.schema import Kind, Phase, RecordName, legacy_to_dotted

_BEFORE, _INSIDE, _AFTER = "before", "inside", "after"


def normalize_name(pattern: str) -> str:
    """ptdbg_ascend's `Tensor___iadd___0_forward` -> `Tensor.__iadd__.0.forward` (others unchanged)."""
    return legacy_to_dotted(pattern)


def name_matches(pattern: str, name: str) -> bool:
    """A `list`/`scope` entry matches a record name exactly, without its counter, or as a substring."""
    return _matches(legacy_to_dotted(pattern), name)


def _matches(pattern: str, name: str) -> bool:
    if pattern in name:
        return True
    parsed = RecordName.parse(name)
    return parsed is not None and parsed.without_index == pattern


def _wants(modes: set, word: str, pair: set) -> bool:
    return "all" in modes or word in modes or not (pair & modes)


class Selection:
    """The scope/list state of one step and the data_mode switches of the debugger."""

    def __init__(self, config: DumpConfig):
        # (patterns in opdiff's dotted form once, not per record)
        self.scope = [legacy_to_dotted(p) for p in config.scope]
        self.names = [legacy_to_dotted(p) for p in config.list]
        modes: set[str] = set(config.data_mode)
        self.want_forward = _wants(modes, Phase.FORWARD, {Phase.FORWARD, Phase.BACKWARD})
        self.want_backward = _wants(modes, Phase.BACKWARD, {Phase.FORWARD, Phase.BACKWARD})
        self.want_input = _wants(modes, "input", {"input", "output"})
        self.want_output = _wants(modes, "output", {"input", "output"})
        self.reset()

    def reset(self) -> None:
        """A new step: the scope has not begun yet."""
        self._state = _BEFORE if self.scope else _INSIDE
        self._closing: str | None = None      # the module call whose return ends the scope
        # the record whose name opened the scope this step: what it reads comes from before
        # the dump, so capture records its tensors as inputs (`Leaves.scope_inputs`)
        self.opened: str | None = None

    def selected(self, name: str, forward_selected: bool = False) -> bool:
        """Apply `scope` and `list` to a record name (counters advance either way).

        `forward_selected`: the name is the backward of a forward record just selected. It is in
        scope because its forward is (the scope may have closed at that very forward), and it
        must not move the scope's state.
        """
        if self.scope and not forward_selected:
            first, last = self.scope
            if self._state == _BEFORE and _matches(first, name):
                self._state = _INSIDE
                self.opened = name
            if self._state != _INSIDE:
                return False
            if _matches(last, name):
                parsed = RecordName.parse(name)
                if parsed is not None and parsed.kind == Kind.MODULE and parsed.phase == Phase.FORWARD:
                    # A module closes the scope when it returns: its own ops are in the range.
                    self._closing = name
                else:
                    self._state = _AFTER
                return True
        if self.names:
            return any(_matches(p, name) for p in self.names)
        return True

    def module_returned(self, name: str) -> None:
        """A module call ended: if it is the scope's last entry, the scope closes now."""
        if self._closing == name:
            self._state = _AFTER
            self._closing = None
