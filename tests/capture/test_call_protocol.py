"""The call protocol the capture layers share (Session.begin/finish, backward.BackwardRecord):
one failure policy, backward records made from the forward call's pending record, and layers
that reach the step's sink only through the Session."""
from __future__ import annotations

import ast
import logging
from pathlib import Path

import torch
import torch.nn as nn

import opdiff
from opdiff.capture import session as capture_session

LAYERS = ["api.py", "aten.py", "modules.py", "backward.py", "leaves.py", "collectives.py",
          "inductor.py", "kernel_recorder.py"]


class _ExplodingList(list):
    """A keyword argument whose iteration raises (a lazily-evaluated container gone wrong)."""

    def __iter__(self):
        raise RuntimeError("iteration exploded")


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x, extra=None):
        return self.lin(x).relu() * self.scale


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Block()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.block(x, extra=_ExplodingList([x])))


def test_layers_reach_the_step_sink_only_through_the_session():
    here = Path(capture_session.__file__).parent
    found = []
    for name in LAYERS:
        tree = ast.parse((here / name).read_text(encoding="utf-8"))
        found += [f"{name}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr == "sink"]
    assert not found, f"layers reaching into Session.sink: {found}"


def test_a_failure_finishing_a_call_marks_its_record_which_keeps_what_could_be_described(
        dump_root, read_dump, caplog):
    """A module's keyword argument that cannot be described: the record is still written, with
    its outputs and parameters, the error on it, one warning; training is untouched."""
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 3)
    want = model(x)
    caplog.set_level(logging.WARNING, logger="opdiff")
    with opdiff.dump(model, dump_root, level="L0"):
        y = model(x)
        y.sum().backward()
    assert torch.equal(y, want)
    assert len([r for r in caplog.records if r.name == "opdiff" and r.levelno >= logging.WARNING]) == 1
    dump = read_dump(dump_root)
    rec = dump["Module.block._Block.forward.0"]
    assert "iteration exploded" in rec["error"]
    assert rec["outputs"][0]["type"] == "tensor" and rec["outputs"][0]["shape"] == [4, 3]
    assert set(rec["parameters"]) == {"scale"}
    assert "Module.head.Linear.backward.0" in dump.by_name       # the others' backward too
    assert "error" not in dump["Module.head.Linear.forward.0"]    # only the failing call marked


def test_backward_records_are_made_from_the_forward_calls_pending_record(dump_root, read_dump):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with opdiff.dump(model, dump_root, level="mix"):
        model(torch.randn(5, 3)).square().mean().backward()
    dump = read_dump(dump_root)
    backward = [r for r in dump.records if r["phase"] == "backward" and r.get("forward")]
    assert {r["kind"] for r in backward} >= {"api", "module"}
    for r in backward:
        forward = dump[r["forward"]]
        assert (r["op"], r["kind"], r["module"], r["stack"]) == \
            (forward["op"], forward["kind"], forward["module"], forward["stack"]), r["name"]
        assert r["inputs"], r["name"]     # the gradients w.r.t. its outputs
