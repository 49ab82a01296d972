"""A tensor changed outside torch between two recorded ops (an extension writing through a
`.numpy()` view, on the target run only) is the origin "outside": the op that reads it next is
not blamed, in statistics and tensor dumps alike. Golden and target are dumped in their own
processes (this file, run as a script) and compared through the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import opdiff
from opdiff.cli import main

TASKS = ("statistics", "tensor")
READER = "Functional.linear.1.forward"       # the op that reads the changed tensor


class Net(nn.Module):
    """Two linear layers; with `outside`, one element of the hidden activation is changed
    through a NumPy view between the two ops (no torch op writes it, its version stays)."""

    def __init__(self, outside: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)
        self.outside = outside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.fc1(x)))
        if self.outside:
            h.detach().numpy()[0, 3] += 0.5      # what an extension kernel writing in place does
        return self.fc2(h)


def _run(side: str, root: str) -> None:
    for task in TASKS:
        torch.manual_seed(0)
        model = Net(outside=side == "target")
        x = torch.randn(4, 16)
        with opdiff.dump(model, f"{root}/{task}", level="mix", task=task):
            model(x).pow(2).mean().backward()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("outside")
    for side, name in (("golden", "golden"), ("golden", "healthy"), ("target", "target")):
        subprocess.run([sys.executable, __file__, side, str(root / name)], check=True, timeout=300)
    return root


def _compare(target: Path, golden: Path, out: Path) -> tuple[int, dict]:
    rc = main(["compare", str(target), str(golden), "-o", str(out), "--no-progress",
               "--fail-on-divergence"])
    return rc, json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_a_tensor_changed_outside_torch_is_the_origin(dumps, tmp_path, task):
    rc, summary = _compare(dumps / "target" / task, dumps / "golden" / task, tmp_path)
    fd = summary["first_divergence"]
    assert rc == 1
    assert fd["origin"] == "outside", fd["reason"]
    assert (fd["name"], fd["op"], fd["phase"]) == (READER, "Functional.linear", "forward")
    assert fd["tensor"] == f"{READER}.input.0"
    assert fd["location"]["file"].endswith("test_outside.py")
    assert "self.fc2(h)" in fd["location"].get("code", "") or fd["location"]["line"] > 0
    assert "changed between two recorded ops without a recorded op writing it" in fd["reason"]
    assert fd["step"] == 0 and fd["rank"] == 0
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    fields = json.loads(lines[0])["fields"]
    rows = [dict(zip(fields, json.loads(line))) for line in lines[1:]]
    # the op that made the tensor agrees with golden; nothing is a local error of an op
    made = [r for r in rows if r["op_name"] == "Torch.relu.0.forward" and r["role"] == "output"]
    assert made and all(r["result"] == "pass" for r in made)
    assert not any(r["result"] == "error" and "local error" in (r.get("reason") or "")
                   for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_healthy_runs_name_nothing(dumps, tmp_path, task):
    rc, summary = _compare(dumps / "healthy" / task, dumps / "golden" / task, tmp_path)
    assert rc == 0 and summary["first_divergence"] is None


def test_the_reader_input_is_marked_only_when_the_values_changed(tmp_path):
    """In-process: the reading op's input carries the values it read and the mark; a healthy
    run, and a tensor changed by a torch op in place (its version moves), carry none."""
    from opdiff.store import open_dump

    def records(outside: bool, inplace: bool, task: str) -> dict:
        torch.manual_seed(0)
        lin1, lin2 = nn.Linear(4, 4), nn.Linear(4, 4)
        x = torch.randn(2, 4)
        path = tmp_path / f"{outside}-{inplace}-{task}"
        with opdiff.dump(None, str(path), level="L1", task=task):
            y = torch.relu(lin1(x))
            if outside:
                y.detach().numpy()[0, 0] += 1.0
            if inplace:
                y.add_(1.0)
            lin2(y)
        dump = open_dump(path / "step0" / "rank0")
        return {r["name"]: r for r in dump.records()}, dump

    for task in ("statistics", "tensor"):
        recs, dump = records(True, False, task)
        made, read = recs["Torch.relu.0.forward"]["outputs"][0], recs[READER]["inputs"][0]
        assert read.get("outside") is True and read["leaf"] == "outside"
        assert read["fqn"] == f"{READER}.input.0"
        assert read["stats"]["mean"] == pytest.approx(made["stats"]["mean"] + 1.0 / 8)
        assert "outside" not in made
        if task == "tensor":
            assert torch.equal(dump.tensor(read["key"]) - dump.tensor(made["key"]),
                               torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0]]))
        for outside, inplace in ((False, False), (False, True)):
            recs, _ = records(outside, inplace, task)
            assert not any(d.get("outside") for r in recs.values() for d in r.get("inputs", [])
                           if isinstance(d, dict))


if __name__ == "__main__":
    _run(sys.argv[1], sys.argv[2])
