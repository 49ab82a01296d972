"""Step boundaries found without edits (autorun.py, in this process): gradient accumulation
keeps its forwards in one step, two optimizers end a step when both stepped, and a loop
without an optimizer counts the model's calls (saying so in one line)."""
from __future__ import annotations

import json

import pytest
import torch

from opdiff.launch.autorun import Autorun
from opdiff.launch.settings import RunSettings


@pytest.fixture
def autorun(tmp_path):
    made = []

    def make(**dump):
        runner = Autorun(RunSettings(dump={"dump_path": str(tmp_path / "dump"), "level": "mix", **dump}))
        runner.install()
        made.append(runner)
        return runner
    yield make
    for runner in made:
        runner.close()
        if not runner.done:
            runner.uninstall()


def _forwards(tmp_path, step: int, op: str = "Functional.linear") -> int:
    path = tmp_path / "dump" / f"step{step}" / "rank0" / "records.jsonl"
    return sum(1 for line in path.open() if (r := json.loads(line))["op"] == op and r["phase"] == "forward")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def test_gradient_accumulation_is_one_step(tmp_path, autorun):
    runner = autorun(step=[0, 1])
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        for _micro in range(2):
            model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert runner.done       # the last configured step is written and every hook is gone
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step0", "step1"]
    assert _forwards(tmp_path, 0) == _forwards(tmp_path, 1) == 4    # 2 micro-batches x 2 linears


def test_two_optimizers_end_a_step_together(tmp_path, autorun):
    autorun(step=[1])
    gen, disc = _model(), _model()
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
    for _ in range(2):
        disc(torch.randn(2, 4)).sum().backward()
        opt_d.step()
        gen(torch.randn(2, 4)).sum().backward()
        opt_g.step()
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step1"]
    assert _forwards(tmp_path, 1) == 4


def test_without_an_optimizer_each_model_call_is_a_step(tmp_path, autorun, capfd):
    autorun(step=[0, 2])
    model = _model()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(2, 4))
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step0", "step2"]
    assert _forwards(tmp_path, 2) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no torch.optim optimizer" in err[0]


def test_a_control_file_switches_recording_while_running(tmp_path):
    control = tmp_path / "control.json"
    control.write_text('{"steps": []}')
    runner = Autorun(RunSettings(dump={"dump_path": str(tmp_path / "dump"), "level": "L1", "step": [0]},
                                 control=str(control)))
    runner.install()
    try:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            if step == 2:     # the bad step was found later: record steps 3 and 4 from now on
                control.write_text('{"steps": [3, 4]}')
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        assert not runner.done        # a control file keeps the boundaries watched
    finally:
        runner.close()
        runner.uninstall()
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step3", "step4"]
