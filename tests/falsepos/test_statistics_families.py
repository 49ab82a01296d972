"""Healthy bf16 statistics dumps of families the other tests do not use name no culprit
(issue 46, item 1), and planted faults in them are still named.

The tutorial's recipe (statistics, level mix, one AdamW step), bf16 autocast against fp32:
- a ResNet-18 named `Tensor.addcmul_` at `opt.step()`: AdamW's `exp_avg_sq.addcmul_(g, g)` is
  a product of two factors that both differ, whose output's norm (the gradient's 4-norm) the
  factors' statistics do not bound (`noise.product_of_differing`);
- HF Mamba named `Torch.matmul` (the selective scan's `ssm_state @ C[:, i]`, the same kind) and
  then `Tensor.__getitem__` (`discrete_A[:, :, i]`, a part of a tensor that differs: its error
  is at most the whole's times norm(whole) / norm(part), `noise.selects_part`).
Both clear with tensor dumps."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opdiff
import opdiff.testing


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18's layout (2-2-2-2 basic blocks), narrow."""

    def __init__(self, width=8, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        layers, cin = [], width
        for i, w in enumerate([width, 2 * width, 4 * width, 8 * width]):
            layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


def _resnet():
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    return ResNet18(), lambda m: F.cross_entropy(m(x), y)


def _mamba():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MambaConfig(vocab_size=64, hidden_size=32, state_size=8,
                                   num_hidden_layers=2, expand=2, conv_kernel=4, use_cache=False)
    ids = torch.randint(0, 64, (2, 12))
    return transformers.MambaForCausalLM(cfg), lambda m: m(input_ids=ids, labels=ids).loss


def _hf(name, config, inputs):
    """A Hugging Face model of family `name` from a tiny config, and its loss on made-up data."""
    def make():
        transformers = pytest.importorskip("transformers")
        ids = torch.randint(0, 64, (2, 10))
        model = getattr(transformers, name)(getattr(transformers, config[0])(**config[1]))
        batch = inputs(ids)
        return model, lambda m: m(**batch).loss
    return make


def _convnext():
    """ConvNeXt's block: a depthwise 7x7 conv, LayerNorm over channels, an inverted MLP."""
    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.dw, self.ln = nn.Conv2d(c, c, 7, padding=3, groups=c), nn.LayerNorm(c)
            self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            y = self.pw2(F.gelu(self.pw1(self.ln(self.dw(x).permute(0, 2, 3, 1)))))
            return x + y.permute(0, 3, 1, 2)
    model = nn.Sequential(nn.Conv2d(3, 16, 4, 4), Block(16), Block(16), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(16, 10))
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    return model, lambda m: F.cross_entropy(m(x), y)


def _lstm():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(64, 16), nn.Linear(32, 64)
            self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)

        def forward(self, ids):
            return self.fc(self.lstm(self.emb(ids))[0])
    ids = torch.randint(0, 64, (2, 10))
    return Tagger(), lambda m: F.cross_entropy(m(ids).flatten(0, 1), ids.flatten())


def _mlp():
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    return model, lambda m: F.cross_entropy(m(x), y)


_SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64)
_SEQ2SEQ = dict(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64)


def _causal(ids):
    return {"input_ids": ids, "labels": ids}


def _to_six(ids):
    return {"input_ids": ids, "labels": ids[:, :6].clone()}


# The families: the two that named a culprit, then the seven HF families and three
# hand-written models on which the recipe already named nothing (kept so it stays that way).
MODELS = {
    "resnet18": _resnet, "mamba": _mamba,
    "gemma2": _hf("Gemma2ForCausalLM", ("Gemma2Config", dict(_SMALL, num_key_value_heads=2,
                                                              head_dim=8)), _causal),
    "gpt_neox": _hf("GPTNeoXForCausalLM", ("GPTNeoXConfig", _SMALL), _causal),
    "distilbert": _hf("DistilBertForSequenceClassification",
                      ("DistilBertConfig", dict(vocab_size=64, dim=32, n_layers=2, n_heads=4,
                                                hidden_dim=64)),
                      lambda ids: {"input_ids": ids, "labels": torch.tensor([0, 1])}),
    "bart": _hf("BartForConditionalGeneration",
                ("BartConfig", dict(_SEQ2SEQ, max_position_embeddings=64)), _to_six),
    "opt": _hf("OPTForCausalLM", ("OPTConfig", dict(vocab_size=64, hidden_size=32,
                                                    num_hidden_layers=2, num_attention_heads=4,
                                                    ffn_dim=64, word_embed_proj_dim=32,
                                                    max_position_embeddings=64)), _causal),
    "whisper": _hf("WhisperForConditionalGeneration",
                   ("WhisperConfig", dict(_SEQ2SEQ, num_mel_bins=8, max_source_positions=16,
                                          max_target_positions=32, decoder_start_token_id=1,
                                          pad_token_id=0)),
                   lambda ids: {"input_features": torch.randn(2, 8, 32),
                                "labels": ids[:, :6].clone()}),
    "convnext": _convnext, "lstm": _lstm, "mlp": _mlp,
}


def run(name, path, *, bf16, fault=None, task="statistics"):
    """The tutorial's step: seeded, one AdamW step, recorded at level mix."""
    opdiff.seed_all(1234)
    model, loss_of = MODELS[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task=task, level="mix", step=[0])
    planted = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with planted:
        dbg.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(model)
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    if fault:
        assert planted.hits == 1
    return path


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    root = tmp_path_factory.mktemp("gold")
    return {name: run(name, root / name, bf16=False) for name in MODELS}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_healthy_bf16_statistics_name_no_culprit(goldens, tmp_path, name):
    result = opdiff.compare(run(name, tmp_path / "t", bf16=True), goldens[name])
    assert result.first_divergence is None, result.verdict
    assert "as far as statistics can tell" in result.verdict


@pytest.mark.slow
@pytest.mark.parametrize("name,fault", [
    ("resnet18", dict(op="Functional.conv2d", call=5, phase="forward", scale=1.05)),
    ("resnet18", dict(op="Functional.batch_norm", call=9, phase="forward", scale=1.05)),
    ("mamba", dict(op="Functional.linear", call=2, phase="forward", scale=1.05)),
    ("mamba", dict(op="Torch.matmul", call=14, phase="forward", scale=1.05)),
    ("gemma2", dict(op="Functional.linear", call=3, phase="forward", scale=1.05)),
    ("whisper", dict(op="Functional.gelu", call=1, phase="forward", scale=1.05)),
    ("convnext", dict(op="Functional.gelu", call=1, phase="forward", scale=1.05)),
    ("lstm", dict(op="Functional.linear", call=0, phase="forward", scale=1.05)),
])
def test_planted_fault_is_still_named(goldens, tmp_path, name, fault):
    result = opdiff.compare(run(name, tmp_path / "t", bf16=True, fault=fault), goldens[name])
    fd = result.first_divergence
    assert fd is not None and fd.name == f"{fault['op']}.{fault['call']}.{fault['phase']}", \
        result.verdict
