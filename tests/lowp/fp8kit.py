"""A 2-layer tiny Llama (from a config, random weights, bf16, CPU) trained one step, in bf16 or
with every decoder Linear in emulated FP8: each input and weight quantized to e4m3 with an amax
scale (multiply, clamp, cast to torch.float8_e4m3fn), dequantized (cast back, divide by the
scale) and multiplied in bf16; the gradient flows straight through the quantize op.

    golden = make_dump(path, "bf16")
    target = make_dump(path, "fp8", plant="wrong:model.layers.1.mlp.up_proj")

Plants: "wrong:<Linear>": that Linear's input scale 2x too large (its largest values clip at
448); "local:<Linear>": its input's amax taken on the first token of each sequence only (the
amax of a local shard); "dequant:<Linear>": its input divided by twice its scale after the
cast back (the quantize op right, its dequantization wrong); "outlier": layer 1's MLP input gets one channel 10^5 larger (its RMSNorm
weight scaled up, the gate and up weights of that channel scaled down by as much: the same
function in exact arithmetic), the outlier channel FP8 is known to lose precision to.
"""
from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import opdiff
from opdiff.testing import inject_fault

E4M3 = torch.float8_e4m3fn
OUTLIER_LAYER = "model.layers.1"
OUTLIER = 1e5


def quantize(x: torch.Tensor, wrong: float = 1.0, local: bool = False,
             dequant: float = 1.0) -> torch.Tensor:
    """x through e4m3 with an amax scale, back in x's dtype (divided by `dequant` times it)."""
    piece = x[..., :1, :] if local and x.dim() > 2 else x
    amax = piece.abs().max().float().clamp(min=1e-12)
    scale = 448.0 / amax * wrong
    q = (x.float() * scale).clamp(-448.0, 448.0).to(E4M3)
    return (q.float() / (scale * dequant)).to(x.dtype)


class FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, wrong, local, dequant):     # type: ignore[override]
        return quantize(x, wrong, local, dequant)

    @staticmethod
    def backward(ctx, grad):                        # type: ignore[override]
        return grad, None, None, None


class FP8Linear(nn.Linear):
    wrong = 1.0
    local = False
    dequant = 1.0

    def forward(self, x):
        return F.linear(FakeQuant.apply(x, self.wrong, self.local, self.dequant),
                        FakeQuant.apply(self.weight, 1.0, False, 1.0), self.bias)


def llama(fp8: bool, plant: Optional[str] = None) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    kind, _, where = (plant or "").partition(":")
    if kind == "outlier":
        with torch.no_grad():
            layer = model.get_submodule(OUTLIER_LAYER)
            layer.post_attention_layernorm.weight[3] *= OUTLIER
            layer.mlp.gate_proj.weight[:, 3] /= OUTLIER
            layer.mlp.up_proj.weight[:, 3] /= OUTLIER
    for name, mod in model.named_modules():
        if fp8 and isinstance(mod, nn.Linear) and name != "lm_head":
            mod.__class__ = FP8Linear
            if name == where:
                mod.wrong = 2.0 if kind == "wrong" else 1.0
                mod.local = kind == "local"
                mod.dequant = 2.0 if kind == "dequant" else 1.0
    return model


def make_dump(path: Path, precision: str, plant: Optional[str] = None) -> Path:
    """One training step (forward, loss, backward) recorded at level mix with tensors; plant
    "fault:<op>:<call>" scales that call's output by 1.05 (`opdiff.testing.inject_fault`)."""
    kind, _, where = (plant or "").partition(":")
    model = llama(precision == "fp8", None if kind == "fault" else plant)
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    shutil.rmtree(path, ignore_errors=True)
    op, _, call = where.rpartition(":")
    planted = inject_fault(op=op, call=int(call), scale=1.05) if kind == "fault" else nullcontext()
    with planted, opdiff.dump(model, str(path), level="mix", task="tensor"):
        model(input_ids=ids, labels=ids).loss.backward()
    return path
