"""The session's parts on their own: the module stack, the selection, the pending record."""
from __future__ import annotations

import threading

import pytest
import torch

import opdiff

from opdiff.capture.selection import Selection, name_matches
from opdiff.capture.sink import PendingRecord
from opdiff.capture.tracker import ModuleStack
from opdiff.config import DumpConfig
from opdiff.store import find_dumps, open_dump


def test_module_stack_names_the_innermost_call_per_thread():
    stack, a, b = ModuleStack(), object(), object()
    assert stack.current is None
    stack.push(a, "Module.a.A.forward.0", "state a")
    stack.push(b, "Module.a.b.B.forward.0", "state b")
    assert stack.current == "Module.a.b.B.forward.0"
    seen = []
    t = threading.Thread(target=lambda: seen.append(stack.current))
    t.start()
    t.join()
    assert seen == [None]                       # another thread runs no module call
    assert stack.pop(a) is None                 # not the innermost call: left as it is
    assert stack.current == "Module.a.b.B.forward.0"
    assert stack.pop(b) == "state b" and stack.pop(a) == "state a"
    assert stack.current is None and stack.pop(a) is None


@pytest.mark.parametrize("pattern, name, matches", [
    ("Functional.relu.0.forward", "Functional.relu.0.forward", True),     # exactly
    ("Functional.relu.forward", "Functional.relu.3.forward", True),       # without the counter
    ("relu", "Functional.relu.3.forward", True),                          # a substring
    ("Tensor___iadd___0_forward", "Tensor.__iadd__.0.forward", True),     # ptdbg_ascend's form
    ("Tensor___iadd___forward", "Tensor.__iadd__.2.forward", True),
    ("Functional.relu.backward", "Functional.relu.3.forward", False),
    ("Module.fc.Linear.forward", "Module.fc.Linear.forward.1", True),
    ("Functional.gelu", "Functional.relu.0.forward", False),
])
def test_a_list_or_scope_entry_matches(pattern, name, matches):
    assert name_matches(pattern, name) is matches


def test_a_scope_ending_at_a_module_closes_when_the_module_returns():
    sel = Selection(DumpConfig.create(scope=["Functional.relu.0.forward", "Module.fc.Linear.forward.0"]))
    assert not sel.selected("Torch.add.0.forward")                  # before the scope
    assert sel.selected("Functional.relu.0.forward")
    assert sel.selected("Module.fc.Linear.forward.0")               # the last entry ...
    assert sel.selected("Functional.linear.0.forward")              # ... its own ops are in
    sel.module_returned("Module.fc.Linear.forward.0")
    assert not sel.selected("Functional.relu.1.forward")            # after the scope
    assert sel.selected("Functional.relu.0.backward", forward_selected=True)
    sel.reset()                                                     # the next step
    assert not sel.selected("Torch.add.0.forward")


def test_data_mode_switches():
    sel = Selection(DumpConfig.create(data_mode=["backward", "input"]))
    assert (sel.want_forward, sel.want_backward, sel.want_input, sel.want_output) == \
        (False, True, True, False)
    sel = Selection(DumpConfig.create())
    assert sel.want_forward and sel.want_backward and sel.want_input and sel.want_output


def test_a_pending_record_keeps_its_call_facts_off_the_record():
    record = {"name": "Tensor.add_.0.forward"}
    pending = PendingRecord(record, index=0)
    pending.inputs_finite = True
    pending.message = "..."
    assert pending.record is record and record == {"name": "Tensor.add_.0.forward"}
    with pytest.raises(AttributeError):       # __slots__: no stray fields
        pending.extra = 1


def _walk(skip: int = 1) -> tuple:
    """The user frames as the uncached walk finds them (the reference for stacks.user_frames)."""
    import sys

    from opdiff.capture.callsite import is_call_frame
    from opdiff.store.frames import is_internal
    f, out = sys._getframe(skip), []
    while f is not None and len(out) < 12:
        if not is_internal(f.f_code.co_filename) and not is_call_frame(f.f_code):
            out.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(out)


def test_user_frames_cached_per_site_equal_the_walk_and_follow_registrations(tmp_path):
    import importlib.util

    from opdiff.capture.stacks import user_frames
    from opdiff.store.frames import register_user_code
    first = [(user_frames(1), _walk(1)) for _ in range(3)]        # one site, three times
    other = (user_frames(1), _walk(1))                             # another line
    assert all(cached == walked for cached, walked in first + [other])
    assert first[0][0][0][1] != other[0][0][1] and first[0][0] == first[2][0]
    # a file that looks like torch's is internal until its directory is registered as user code
    pkg = tmp_path / "site-packages" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "looks_internal.py").write_text(
        "from opdiff.capture.stacks import user_frames\n"
        "def where():\n    return user_frames(1)\n")
    spec = importlib.util.spec_from_file_location("looks_internal", pkg / "looks_internal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert all(f[0] != str(pkg / "looks_internal.py") for f in module.where())
    register_user_code(str(pkg))
    assert module.where()[0][:3] == (str(pkg / "looks_internal.py"), 3, "where")


class _Block(torch.nn.Module):
    """User code inside a module's forward, calling torch's modules and a user helper."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())

    def forward(self, x):
        return _helper(self.inner(self.fc(x)))


def _helper(x):
    return torch.tanh(x) * 2


def _run_block(model, x):
    return model(x).sum()


def test_op_stacks_inside_modules_equal_the_full_walk(tmp_path):
    """At mix the walk for an op stops at the module call it runs in and takes the user frames
    outside it from that call (stacks.py `anchor`); the stacks recorded must be those the full
    walk finds (L1 has no module calls: it always walks the whole stack)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(), _Block())
    x = torch.randn(2, 8)
    stacks = {}
    for level in ("L1", "mix"):
        dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / level), level=level)
        dbg.start(model)
        _run_block(model, x).backward()
        dbg.stop()
        dbg.step()
        dump = open_dump(find_dumps(tmp_path / level)[0])
        stacks[level] = {r["name"]: [(f["file"], f["line"], f["function"]) for f in dump.stack(r["stack"])]
                         for r in dump.records() if r["kind"] == "api" and r["phase"] == "forward"}
    assert stacks["L1"] == stacks["mix"]
    tanh = stacks["mix"]["Torch.tanh.1.forward"]
    assert [f[2] for f in tanh[:4]] == ["_helper", "forward", "_run_block",
                                        "test_op_stacks_inside_modules_equal_the_full_walk"]
