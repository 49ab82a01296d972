"""Two fp32 runs of a tiny BERT whose weights differ by 1e-7 of their size (what a checkpoint
round trip through another device or framework gives) name no op at level mix.

The loss is the mean square of BERT's last LayerNorm output, so the gradient reaching that
LayerNorm is mathematically near zero: rounding noise on both sides, 88% apart. The LayerNorm's
backward then moved its output's norm 4.3x: noise in, noise out (`comparison/noise.py`,
`NOISE_INPUT_ERROR`), not a local error. It named `Functional.layer_norm.3.backward` before.
At L2 the same pair named `Aten.native_layer_norm.1.forward`: its second output, the row mean,
of activations around 1 that sum to 1e-3, carries its input's error 750-fold (`noise.cancels`).
A planted 1% fault in a forward linear of the same pair is still named. One AdamW step of the
same pair named the key projection's bias gradient (`Policy.within_input_noise`)."""
from __future__ import annotations

import contextlib

import pytest
import torch

import opdiff
from opdiff.testing import inject_fault

transformers = pytest.importorskip("transformers")


def _dump(path, nudge: bool, fault=None, level: str = "mix", train: bool = False):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 64, (2, 8))
    if nudge:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=g))
    planted = inject_fault(op="Functional.linear", call=5, scale=1.01) if fault else \
        contextlib.nullcontext()
    if train:       # one AdamW step on a regression loss (the issue-47 repro)
        y = torch.randn(2, 8, 32)
        opt = torch.optim.AdamW(model.train().parameters(), lr=1e-3)
        with planted, opdiff.dump(model, str(path), level=level, task="statistics"):
            torch.nn.functional.mse_loss(model(input_ids=ids).last_hidden_state, y).backward()
            opt.step()
            opt.zero_grad()
        return path
    with planted, opdiff.dump(model, str(path), level=level, task="statistics"):
        model(input_ids=ids).last_hidden_state.pow(2).mean().backward()
    return path


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("bert") / "g", nudge=False)


def test_weights_nudged_by_rounding_name_nothing(golden, tmp_path):
    result = opdiff.compare(_dump(tmp_path / "t", nudge=True), golden)
    assert result.first_divergence is None, result.verdict


def test_a_fault_in_the_same_pair_is_still_named(golden, tmp_path):
    result = opdiff.compare(_dump(tmp_path / "t", nudge=True, fault=True), golden)
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.linear.5.forward", result.verdict


@pytest.mark.slow
def test_weights_nudged_by_rounding_name_nothing_at_l2(tmp_path):
    golden = _dump(tmp_path / "g", nudge=False, level="L2")
    result = opdiff.compare(_dump(tmp_path / "t", nudge=True, level="L2"), golden)
    assert result.first_divergence is None, result.verdict


@pytest.mark.parametrize("level", ["mix", "L2"])
def test_a_training_step_of_weights_nudged_names_nothing(tmp_path, level):
    # The key projection's bias gradient is mathematically 0 (softmax is shift-invariant): 16
    # rows of 3e-5 that cancel to 2e-12 on each side, 55% apart. The sum's own roundings,
    # which differ once its inputs do, explain that (`Policy.within_input_noise`);
    # `Functional.linear.1.backward` (mix) and `Aten.sum.10.backward` (L2) were named.
    golden = _dump(tmp_path / "g", nudge=False, level=level, train=True)
    result = opdiff.compare(_dump(tmp_path / "t", nudge=True, level=level, train=True), golden)
    assert result.first_divergence is None, result.verdict


def test_a_fault_in_a_training_step_of_weights_nudged_is_named(tmp_path):
    golden = _dump(tmp_path / "g", nudge=False, train=True)
    result = opdiff.compare(_dump(tmp_path / "t", nudge=True, fault=True, train=True), golden)
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.linear.5.forward", result.verdict
