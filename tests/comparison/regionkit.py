"""Tiny models whose runs can execute different attention ops (eager, SDPA), dumped the way
tests/comparison/test_regions*.py need: Hugging Face models built from configs (see
conftest.py's `hf_dump`), and a bare attention block (`block_dump`)."""
from __future__ import annotations

import json
import math
import shutil
import types
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F

import opdiff
from opdiff.testing import inject_fault


def _rms_norm(self, x):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)


def _model(family: str, impl: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    if family == "llama" and impl == "rms_norm":    # eager attention, norms through F.rms_norm
        model = _model("llama", "eager")
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.forward = types.MethodType(_rms_norm, module)
        return model
    if family == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
            attn_implementation=impl)
        return transformers.LlamaForCausalLM(cfg)
    if family == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu", attn_implementation=impl,
            bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(cfg)
    if family == "qwen2":
        cfg = transformers.Qwen2Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
            attn_implementation=impl)
        return transformers.Qwen2ForCausalLM(cfg)
    raise ValueError(family)


def rename_attention(model: torch.nn.Module, name: str = "NpuAttention") -> None:
    """Give every attention module a class of another name (a port's own attention class, the
    same computation): module calls keep their paths, their names carry the new class."""
    for module in model.modules():
        if type(module).__name__.endswith("Attention") and "Rotary" not in type(module).__name__:
            module.__class__ = type(name, (type(module),), {})


def make_dump(path: Path, family: str, impl: str, task: str, fault: Optional[str] = None,
              bf16: bool = False, noise: float = 0.0, renamed: bool = False,
              phase: str = "forward") -> Path:
    """fault: "op:call", that call's output (phase "backward": its gradients w.r.t. its
    inputs) scaled by 1.02 or, with `noise`, given Gaussian noise of that size relative to each
    value (`inject_fault`); renamed: the attention class is `NpuAttention` (`rename_attention`)."""
    torch.manual_seed(0)
    model = _model(family, impl).eval()
    if renamed:
        rename_attention(model)
    ids = torch.randint(0, 64, (2, 8))
    planted = nullcontext()
    if fault:
        op, call = fault.split(":")
        planted = inject_fault(op=op, call=int(call), scale=1.0 if noise else 1.02,
                               noise=noise, phase=phase)
    with planted:
        with opdiff.dump(model, str(path), level="mix", task=task):
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
                loss = model(ids, labels=ids).loss
            loss.backward()
    if fault:
        assert planted.hits == 1     # type: ignore[attr-defined]
    return path


class Attention(torch.nn.Module):
    """q, k, v projections, attention as `F.scaled_dot_product_attention` (fused) or eager
    `matmul -> softmax -> matmul`, an output projection."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        # (no bias on k: softmax makes its gradient zero, and the runs' rounding of zero differs)
        self.q, self.k, self.v = (torch.nn.Linear(16, 16, bias=False) for _ in range(3))
        self.o = torch.nn.Linear(16, 16)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, 2, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.fused:
            h = F.scaled_dot_product_attention(q, k, v)
        else:
            w = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(8)
            h = torch.matmul(torch.softmax(w, dim=-1), v)
        return self.o(h.transpose(1, 2).reshape(b, t, 16))


class Block(torch.nn.Module):
    def __init__(self, fused: bool, attention: type = Attention) -> None:
        super().__init__()
        self.attn, self.fc = attention(fused), torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(torch.relu(self.attn(x)))


def block_dump(path: Path, fused: bool, fault: Optional[str] = None, phase: str = "forward",
               task: str = "tensor", make: Callable[[bool], torch.nn.Module] = Block) -> Path:
    """One training step of `make(fused)` on an input that needs no gradient, dumped at level
    mix; fault: that op's first call's output (phase "backward": its input gradients) scaled
    by 1.02 (`inject_fault`)."""
    torch.manual_seed(0)
    model = make(fused)
    x = torch.randn(2, 5, 16)
    planted = inject_fault(op=fault, call=0, scale=1.02, phase=phase) if fault else nullcontext()
    with planted:
        with opdiff.dump(model, str(path), level="mix", task=task):
            model(x).sum().backward()
    if fault:
        assert planted.hits == 1     # type: ignore[attr-defined]
    return path


def without_dataflow(src: Path, dst: Path) -> Path:
    """A copy of a dump as one written before dataflow existed (no producers, no meta flag)."""
    shutil.copytree(src, dst)
    for f in dst.rglob("records.jsonl"):
        text = f.read_text()
        lines = []
        for line in text.splitlines():
            record = json.loads(line)
            for d in record.get("inputs") or []:
                d.pop("producer", None)
                for item in d.get("items") or []:
                    if isinstance(item, dict):
                        item.pop("producer", None)
            lines.append(json.dumps(record))
        f.write_text("\n".join(lines) + "\n")
    for f in dst.rglob("meta.json"):
        meta = json.loads(f.read_text())
        meta.pop("dataflow", None)
        f.write_text(json.dumps(meta))
    return dst
