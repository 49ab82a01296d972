"""The dump `opdiff trend` asks for next (next_dump.json: one step, scoped to the module it
located) finds the fault it located (issue 46, item 2).

Before: the scoped dump of the faulty block said "no op is to blame" or named a backward op; the
block's own row said "inherited from the inputs (input rel err 0)": the gradients its backward
ops showed (which differ because its output does) were taken to explain its forward call. And
a scoped dump did not record what the scope starts from: the tensors its module call reads,
made before the dump, were no one's output and no input, so a difference there was blamed on
the first op inside that read them."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff
from opdiff.demo.trend_runs import next_token_loss
from opdiff.trend import trend

from .training import TinyTransformer, batches, plant, train

STEPS, FAULT_STEP = 10, 6


@pytest.fixture(scope="module")
def next_dump(tmp_path_factory):
    """trend's own next_dump.json for a fault planted in blocks.1 from step 6 on."""
    root = tmp_path_factory.mktemp("trend")
    train(root / "golden", STEPS)
    train(root / "block", STEPS, fault="block", fault_step=FAULT_STEP)
    trend(root / "block", root / "golden", output=root / "out")
    config = root / "out" / "next_dump.json"
    assert json.loads(config.read_text())["statistics"]["scope"] == \
        ["Module.blocks.1.Block.forward"] * 2
    return config


def _dump(config, path, faulty_block=None):
    """The training run again, dumped as next_dump.json says (its step, its scope)."""
    dbg = opdiff.PrecisionDebugger(config_path=str(config), dump_path=str(path))
    opdiff.seed_all(0)
    model = TinyTransformer()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    data, now = batches(), {"step": -1}
    if faulty_block is not None:
        plant(model.blocks[faulty_block], lambda: now["step"] >= FAULT_STEP,
              lambda y: y * (1 + 1e-3))
    for step in range(FAULT_STEP + 1):
        now["step"] = step
        dbg.start(model)
        tokens = data[step % len(data)]
        next_token_loss(model(tokens), tokens).backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    return path


@pytest.mark.slow
def test_trends_scoped_dump_names_the_block_it_located(next_dump, tmp_path):
    result = opdiff.compare(_dump(next_dump, tmp_path / "t", faulty_block=1),
                            _dump(next_dump, tmp_path / "g"))
    fd = result.first_divergence
    assert fd is not None, result.verdict
    assert fd.phase == "forward" and fd.name == "Module.blocks.1.Block.forward.0", result.verdict
    row = next(r for r in result.rows
               if r.target_name == "Module.blocks.1.Block.forward.0.output.0")
    assert "inherited" not in row.reason, row.reason


@pytest.mark.slow
def test_a_scoped_dump_records_what_the_scope_starts_from(next_dump, tmp_path):
    """The fault is before the scope (blocks.0): the scope's input differs, and the verdict says
    the difference was made before the scope opened, naming no op inside it."""
    target = _dump(next_dump, tmp_path / "t", faulty_block=0)
    records = [json.loads(line) for line in
               (target / f"step{FAULT_STEP}" / "rank0" / "records.jsonl").read_text().splitlines()]
    leaves = {r["name"]: r for r in records if r.get("kind") == "leaf" and r["leaf"] == "input"}
    assert "Input.blocks.1.input0.0.forward" in leaves, sorted(leaves)
    result = opdiff.compare(target, _dump(next_dump, tmp_path / "g"))
    fd = result.first_divergence
    assert fd is not None and fd.origin == "input", result.verdict
    assert fd.tensor == "blocks.1.input0" and "before it opened" in fd.reason, result.verdict
