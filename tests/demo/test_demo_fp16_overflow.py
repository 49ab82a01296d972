"""Scenario fp16-overflow (seed 000's first check): fp16 autocast makes a hand-written softmax
overflow. The online overflow check and the offline analysis must both find torch.exp, in the
forward, and not blame the ops the inf spread to."""
from __future__ import annotations

import json
import os

import pytest
import torch

import opdiff
from opdiff.demo import models, scenarios
from opdiff.report import outputs

from .helpers import model_line, needs_demo_as_user_code, play

ORIGIN = "Torch.exp.0.forward"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return play("fp16-overflow", tmp_path_factory.mktemp("fp16") / "out")


def test_online_check_stops_training_at_exp(demo):
    result, text = demo
    assert result.online_origin is not None, "training did not stop"
    assert ORIGIN in result.online_origin and "(forward, step 0)" in result.online_origin
    dump = result.output / "dump" / "overflow_check" / "step0" / "rank0" / "records.jsonl"
    records = [json.loads(line) for line in dump.read_text().splitlines() if line]
    assert [r["name"] for r in records] == [ORIGIN]       # only the origin is dumped
    assert "training stopped: inf/NaN first created by Torch.exp.0.forward" in text


def test_offline_analysis_finds_exp_and_does_not_blame_downstream(demo):
    result, _ = demo
    origin = result.overflow.origin
    assert (origin.name, origin.op, origin.phase) == (ORIGIN, "Torch.exp", "forward")
    assert origin.module == "Module.softmax.ScaledSoftmax.forward.0"
    step = result.overflow.steps[0]
    assert [o.name for o in step.origins] == [ORIGIN]
    chain = {link.name: link.relation for link in step.chain}
    # The inf reached the log, the loss and the backward: all carried, none born there.
    assert chain["Torch.log.0.forward"] == "propagates"
    assert chain["Functional.nll_loss.0.forward"] == "propagates"
    assert any(name.endswith(".backward") for name in chain)
    saved = json.loads((result.output / "overflow.json").read_text())
    assert saved["origin"]["name"] == ORIGIN
    assert result.found and result.culprit == ORIGIN


@needs_demo_as_user_code
def test_origin_points_at_the_exp_line(demo):
    result, text = demo
    loc = result.overflow.origin.location
    assert os.path.samefile(loc.file, models.__file__)
    assert loc.line == model_line(models.ScaledSoftmax, "e = torch.exp(logits * self.scale)")
    assert "e = torch.exp(logits * self.scale)" in text
    # The next line's `/` is recorded as the operator the model wrote, and only carries the inf.
    chain = {link.name: link.relation for link in result.overflow.steps[0].chain}
    assert chain["Tensor.__truediv__.0.forward"] == "propagates"


def test_the_same_model_is_fine_in_fp32(tmp_path):
    model, batch = scenarios.seeded_resnet(softmax_scale=100.0)
    losses = scenarios.train(model, batch, tmp_path / "fp32", task="overflow_check",
                              probabilities=True, steps=1)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_a_second_demo_replaces_the_first_and_keeps_user_files(demo):
    result, _ = demo
    out = result.output
    notes = out / "my-notes.txt"
    notes.write_text("mine")
    first = (out / "overflow.json").stat().st_ino, (out / "overflow.json").stat().st_mtime_ns
    again, _ = play("fp16-overflow", out)
    assert again.found
    second = (out / "overflow.json").stat().st_ino, (out / "overflow.json").stat().st_mtime_ns
    assert second != first
    assert notes.read_text() == "mine"
    top = {n.split("/")[0] for n in outputs.written(out)}
    assert top == {"dump", "overflow.json"}
    assert opdiff.overflow.analyze(out / "dump" / "statistics").origin.name == ORIGIN


def test_the_callers_threads_generators_and_determinism_are_put_back(tmp_path):
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(False)
    torch.manual_seed(7)
    expected_next = torch.rand(3)
    torch.manual_seed(7)
    play("fp16-overflow", tmp_path / "out")
    assert torch.get_num_threads() == 2
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.equal(torch.rand(3), expected_next)
