"""Two real training runs of a small transformer (120 steps, fp32, seeded): trend names the step
and the module where a fault planted from step 60 on starts, names the optimizer when the
learning rate changes, and names nothing for a healthy bf16-autocast run."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff
from opdiff.trend import trend

from .training import train

STEPS, FAULT_STEP = 120, 60


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    losses = {
        "golden": train(root / "golden", STEPS),
        "block": train(root / "block", STEPS, fault="block", fault_step=FAULT_STEP),
        "lr": train(root / "lr", STEPS, fault="lr", fault_step=FAULT_STEP),
        "bf16": train(root / "bf16", STEPS, autocast=torch.bfloat16),
    }
    return root, losses


def test_the_planted_faults_really_change_the_runs(runs):
    _, losses = runs
    assert losses["block"][:FAULT_STEP] == losses["golden"][:FAULT_STEP]
    assert losses["block"][FAULT_STEP] != losses["golden"][FAULT_STEP]
    # The learning rate acts on the update of step 60, so the loss moves one step later.
    assert losses["lr"][:FAULT_STEP + 1] == losses["golden"][:FAULT_STEP + 1]
    assert losses["lr"][FAULT_STEP + 1] != losses["golden"][FAULT_STEP + 1]
    assert losses["bf16"][0] != losses["golden"][0]


def test_a_fault_in_one_block_is_named_with_its_step(runs, tmp_path):
    root, _ = runs
    result = trend(root / "block", root / "golden", output=tmp_path)
    first = result.first_divergence
    assert first is not None
    assert (first.step, first.module, first.phase) == (FAULT_STEP, "blocks.1", "forward")
    assert first.quantity.startswith("fwd_")
    assert "bitwise equal in steps 0-59" in first.reason
    assert result.message.startswith(f"the runs part at step {FAULT_STEP}, first in blocks.1 (")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["first_divergence"]["step"] == FAULT_STEP
    assert summary["first_divergence"]["module"] == "blocks.1"
    assert set(summary["first_divergence"]) >= {"step", "module", "quantity", "phase", "reason"}
    assert isinstance(summary["alerts"], list)


def test_a_wrong_learning_rate_is_named_as_the_optimizer(runs):
    root, _ = runs
    first = trend(root / "lr", root / "golden").first_divergence
    assert first is not None
    assert (first.step, first.module, first.phase) == (FAULT_STEP, "optimizer", "optimizer")
    assert first.quantity == "update_norm"
    assert first.to_dict()["parameter"]          # which parameter's update showed it first


def test_healthy_bf16_against_fp32_names_no_step(runs):
    root, _ = runs
    result = trend(root / "bf16", root / "golden")
    assert result.first_divergence is None, result.message
    assert result.verdict in ("agree", "drift")
    assert result.ranks[0].closest["sigma"] < 8         # how close the nearest excursion came
    assert not result.problems


def test_identical_runs_agree(runs):
    root, _ = runs
    result = trend(root / "golden", root / "golden")
    assert result.first_divergence is None and result.verdict == "agree"


def test_next_dump_is_a_config_the_debugger_loads_and_dumps_that_step_and_block(runs, tmp_path):
    root, _ = runs
    result = trend(root / "block", root / "golden", output=tmp_path / "out")
    config = json.loads((tmp_path / "out" / "next_dump.json").read_text())
    assert config["step"] == [FAULT_STEP] and config["level"] == "mix"
    assert config["statistics"]["scope"] == ["Module.blocks.1.Block.forward"] * 2
    dbg = opdiff.PrecisionDebugger(config_path=str(tmp_path / "out" / "next_dump.json"),
                                   dump_path=str(tmp_path / "dump"))
    assert dbg.config.step == [FAULT_STEP] and dbg.config.task == "statistics"
    # Run three steps around it with the config's step moved to 1: only that step is dumped,
    # and only the block's region.
    dbg = opdiff.PrecisionDebugger(config_path=str(tmp_path / "out" / "next_dump.json"),
                                   dump_path=str(tmp_path / "dump"), step=[1])
    from .training import TinyTransformer, batches
    import torch.nn.functional as F
    opdiff.seed_all(0)
    model = TinyTransformer()
    tokens = batches(1)[0]
    for _ in range(3):
        dbg.start(model)
        F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
        dbg.stop()
        dbg.step()
    steps = sorted(p.name for p in (tmp_path / "dump").iterdir() if p.name.startswith("step"))
    assert steps == ["step1"]
    records = [json.loads(line) for line in
               (tmp_path / "dump" / "step1" / "rank0" / "records.jsonl").read_text().splitlines()]
    names = [r["name"] for r in records]
    assert any(n.startswith("Module.blocks.1.Block.forward") for n in names)
    assert any(n.startswith("Module.blocks.1.fc1.") for n in names)      # inside the block
    assert not any(n.startswith(("Module.blocks.0.", "Module.blocks.2.", "Module.head."))
                   for n in names)
    assert result.files["next_dump.json"] == str(tmp_path / "out" / "next_dump.json")


def test_page_is_self_contained_with_both_runs_and_the_step(runs, tmp_path):
    root, _ = runs
    trend(root / "block", root / "golden", output=tmp_path)
    page = (tmp_path / "trend.html").read_text()
    assert page.count("<svg") >= 4                   # loss, grad norm, the block, its difference
    assert "blocks.1: forward output norm" in page
    assert "step 60: the runs part" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "default-src 'none'" in page
    assert page.count(">target</title>") >= 3 and page.count(">golden</title>") >= 3
