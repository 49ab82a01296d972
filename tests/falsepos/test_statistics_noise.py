"""Statistics dumps name no false culprit where a value is rounding noise around a true zero.

The key projection's bias gradient is mathematically 0 (softmax is shift-invariant), so in a
healthy bf16-autocast run it differs from fp32 by 100% and more of its own size; measured
against the grad-output it was reduced from it is bf16 noise (verdicts.Policy.within_input_noise).
A planted kernel fault in the same model is still named.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opdiff
import opdiff.testing
from opdiff.comparison.metric_table import Measurement
from opdiff.comparison.verdicts import Policy


class Attention(nn.Module):
    """One pre-softmax attention block with biases on q, k and v (the key bias's gradient is 0)."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=True) for _ in range(4))
        self.heads, self.norm = heads, nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = F.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return self.norm(x + self.o((a @ v).transpose(1, 2).reshape(b, t, d)))


class TwoBlocks(nn.Module):
    """Two attention blocks and a head."""

    def __init__(self):
        super().__init__()
        self.blocks, self.head = nn.Sequential(Attention(), Attention()), nn.Linear(32, 8)

    def forward(self, x):
        return self.head(self.blocks(x))


def _attention():
    return TwoBlocks(), {"x": torch.randn(2, 8, 32)}


def _bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg), {"input_ids": torch.randint(0, 64, (2, 8))}


def _vit():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.ViTModel(cfg), {"pixel_values": torch.randn(2, 3, 16, 16)}


MODELS = {"attention": _attention, "bert": _bert, "vit": _vit}


def run(name, path, *, bf16, fault=None):
    """One forward and backward of a model, dumped with the default task="statistics"."""
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), level="mix")
    planted = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with planted:
        dbg.start(model)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(**inputs)
            out = out if isinstance(out, torch.Tensor) else out.last_hidden_state
            out.float().pow(2).mean().backward()
        finally:
            dbg.stop()
            dbg.step()      # closes the step (and unfreezes gc for the tests after this one)
    if fault:
        assert planted.hits == 1
    return path


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    return tmp_path_factory.mktemp("gold")


def _golden(goldens, name):
    path = goldens / name
    if not path.exists():
        run(name, path, bf16=False)
    return path


@pytest.mark.parametrize("name", ["attention", pytest.param("bert", marks=pytest.mark.slow),
                                  pytest.param("vit", marks=pytest.mark.slow)])
def test_healthy_bf16_statistics_name_no_culprit(goldens, tmp_path, name):
    result = opdiff.compare(run(name, tmp_path / "t", bf16=True), _golden(goldens, name))
    assert result.first_divergence is None, result.verdict
    assert result.counts["error"] == 0
    # autocast reorders parameters_grad and linear backward records: they pair all the same
    grads = [r for r in result.rows if "parameters_grad" in (r.target_name or r.golden_name)]
    assert grads and all(r.result != "unmatched" for r in grads), \
        [r.target_name or r.golden_name for r in grads if r.result == "unmatched"]


@pytest.mark.parametrize("name,fault", [
    ("attention", dict(op="Functional.linear", call=1, phase="backward", scale=2.0)),
    ("attention", dict(op="Functional.linear", call=4, phase="forward", scale=1.05)),
    pytest.param("bert", dict(op="Functional.linear", call=3, phase="backward", scale=2.0),
                 marks=pytest.mark.slow)])
def test_planted_fault_in_the_same_model_is_still_named(goldens, tmp_path, name, fault):
    result = opdiff.compare(run(name, tmp_path / "t", bf16=True, fault=fault),
                            _golden(goldens, name))
    fd = result.first_divergence
    assert fd is not None and fd.name == f"{fault['op']}.{fault['call']}.{fault['phase']}", \
        result.verdict


def _m(norm, abs_error, numel):
    return Measurement({"RMSE": abs_error / numel ** 0.5}, error=1.0, numel=numel, norm=norm)


@pytest.mark.parametrize("out,inputs,noise", [
    (_m(1e-6, 1e-6, 32), [_m(1e-3, 1e-6, 512)], True),      # noise around a true zero
    (_m(1e-6, 1e-6, 32), [_m(1e-3, 1e-6, 16)], False),      # the input holds fewer elements
    (_m(1e-3, 1e-3, 32), [_m(1e-3, 1e-6, 512)], False),     # as large as its grad-output
    (_m(1e-4, 1e-4, 32), [_m(1e-3, 1e-6, 512)], False),     # 10% of the grad-output: real
    (_m(1e-6, 1e-6, 32), [_m(0.0, 0.0, 512)], False),       # identical inputs: no scale known
])
def test_within_input_noise_rule(out, inputs, noise):
    assert Policy().within_input_noise(out, inputs, 1.6e-2) is noise
