"""An inf/NaN that never reaches the loss, a gradient or a parameter is "created and discarded":
written as such, not counted, and training goes on (Hugging Face T5's `torch.log(0)` in its
relative-position bucketing). A real overflow is still caught."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import opdiff
from opdiff.overflow import DISCARDED, OVERFLOW, analyze

from . import models


class Bucketing(nn.Module):
    """torch.log(0) made on purpose and dropped: one branch of a where, one cast to integers."""

    def forward(self, h):
        zero = torch.zeros_like(h)
        h = torch.where(h > -1e9, h, torch.log(zero))       # -inf made, never selected
        buckets = torch.log(zero.abs()).clamp(min=-3).to(torch.long)   # -inf clamped, made long
        return h + buckets


class DiscardsInf(nn.Module):
    """A linear layer and the bucketing (inf made in the root module's own forward, outside
    every recorded module, counts at once: nothing tells it from the loss)."""

    def __init__(self):
        super().__init__()
        self.fc, self.bucketing = nn.Linear(8, 8), Bucketing()

    def forward(self, x):
        return self.bucketing(self.fc(x))


def _records(path):
    return [json.loads(line) for f in sorted(path.rglob("records.jsonl"))
            for line in f.read_text().splitlines() if line]


def _train(model, loss_of, path, steps=2):
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="overflow_check", level="mix",
                                   overflow_nums=1)
    try:
        for _ in range(steps):
            dbg.start(model)
            loss_of(model).backward()
            model.zero_grad()
            dbg.stop()
            dbg.step()
    finally:
        dbg.stop()
    return dbg


def test_discarded_inf_does_not_stop_training(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    dbg = _train(DiscardsInf(), lambda m: m(x).pow(2).mean(), tmp_path / "d")
    assert dbg.overflows == []
    assert dbg.session.overflow.discarded >= 2
    discarded = [r for r in _records(tmp_path / "d") if r.get("overflow") == "discarded"]
    assert {r["name"] for r in discarded} >= {"Torch.log.0.forward", "Torch.log.1.forward"}
    assert not [r for r in _records(tmp_path / "d") if r.get("overflow") == "origin"]


def test_real_overflow_is_still_caught(tmp_path):
    model, inputs = models.build("exp")
    with pytest.raises(opdiff.OverflowDetected, match=r"Torch\.exp\.0\.forward"):
        _train(model, lambda m: models.step(m, inputs) or torch.zeros((), requires_grad=True),
               tmp_path / "e", steps=1)


@pytest.mark.slow
def test_healthy_t5_trains_under_overflow_check(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                num_heads=2, relative_attention_num_buckets=8, dropout_rate=0.0,
                                decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg)
    ids, labels = torch.randint(1, 64, (2, 6)), torch.randint(1, 64, (2, 5))
    dbg = _train(model, lambda m: m(input_ids=ids, labels=labels).loss, tmp_path / "t5")
    assert dbg.overflows == []
    discarded = [r for r in _records(tmp_path / "t5") if r.get("overflow") == "discarded"]
    assert discarded and all(r["op"] == "Torch.log" for r in discarded), \
        [r["name"] for r in discarded]


def test_offline_analysis_calls_it_created_and_discarded(tmp_path):
    torch.manual_seed(0)
    model, x = DiscardsInf(), torch.randn(4, 8)
    with opdiff.dump(model, str(tmp_path / "s"), level="mix", task="statistics"):
        model(x).pow(2).mean().backward()
    result = analyze(tmp_path / "s")
    assert result.status == DISCARDED and result.origin is None
    step = result.steps[0]
    assert step.origins[0].name == "Torch.log.0.forward" and step.origins[0].discarded
    assert "created and discarded" in step.message


def test_offline_analysis_still_finds_a_real_overflow(tmp_path):
    model, inputs = models.build("exp")
    with opdiff.dump(model, str(tmp_path / "s"), level="mix", task="statistics"):
        models.step(model, inputs)
    result = analyze(tmp_path / "s")
    assert result.status == OVERFLOW and result.origin.name == "Torch.exp.0.forward"


class MaskedScores(nn.Module):
    """An HF-style additive attention mask: finfo(float32).min where masked, then a big value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        scores = self.fc(x)
        mask = torch.zeros_like(scores).masked_fill(x > 0, torch.finfo(torch.float32).min)
        return (scores + mask).softmax(-1), torch.exp(scores * 30)


def test_headroom_skips_finfo_min_masks_and_labels_the_step(tmp_path):
    from opdiff.overflow.console import print_overflow
    from rich.console import Console

    torch.manual_seed(0)
    model, x = MaskedScores(), torch.randn(4, 8)
    with opdiff.dump(model, str(tmp_path / "s"), level="mix", task="statistics"):
        probs, big = model(x)
        (probs.sum() + big.sum()).backward()
    result = analyze(tmp_path / "s", headroom_factor=1.0)
    names = [w.name for w in result.headroom]
    assert "Torch.exp.0.forward" in names          # a value that grew is still flagged
    assert not [n for n in names if "masked_fill" in n or n == "Tensor.__add__.0.forward"], names
    console = Console(record=True, width=200)
    print_overflow(result, console=console)
    assert "step 0: Torch.exp.0.forward" in console.export_text()
