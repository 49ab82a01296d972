"""The case issue 25 is about, on a real GPU: a tiny Hugging Face Llama whose target run uses
SDPA on CUDA (PyTorch picks its flash or memory-efficient kernel there) against a golden run
with eager attention math on the CPU. Healthy pairs name nothing, fp32 and bf16 autocast alike;
a 2% fault planted in the SDPA call names the attention region of that layer; a fault in a
later op (silu) names that op. Also the same-dtype backward rule across devices
(`verdicts.within_input_noise`): an fp32 L2 dump on CUDA against the CPU names nothing."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import pytest
import torch

import opdiff
from opdiff.testing import inject_fault

pytestmark = pytest.mark.cuda


def _llama(impl: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attn_implementation=impl)
    return transformers.LlamaForCausalLM(cfg)


def _dump(path, device: str, impl: str, task: str, level: str = "mix", bf16: bool = False,
          fault: Optional[str] = None):
    torch.manual_seed(0)
    model = _llama(impl).eval().to(device)
    ids = torch.randint(0, 64, (2, 16)).to(device)
    planted = nullcontext()
    if fault:
        op, call = fault.split(":")
        planted = inject_fault(op=op, call=int(call), scale=1.02)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False     # fp32 as fp32 (see test_cuda_compare.py)
    try:
        with planted, opdiff.dump(model, str(path), level=level, task=task):
            with torch.autocast(device, dtype=torch.bfloat16) if bf16 else nullcontext():
                loss = model(ids, labels=ids).loss
            loss.backward()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return path


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu")
    return {task: _dump(root / task, "cpu", "eager", task) for task in ("statistics", "tensor")}


@pytest.mark.parametrize("task", ["statistics", "tensor"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_cuda_sdpa_against_cpu_eager_names_nothing(golden, tmp_path, task, bf16):
    target = _dump(tmp_path / "t", "cuda", "sdpa", task, bf16=bf16)
    result = opdiff.compare(target, golden[task])
    assert result.first_divergence is None, result.verdict


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_in_cuda_sdpa_names_the_attention_region(golden, tmp_path, task):
    target = _dump(tmp_path / "t", "cuda", "sdpa", task,
                   fault="Functional.scaled_dot_product_attention:1")
    fd = opdiff.compare(target, golden[task]).first_divergence
    assert fd is not None, "the planted SDPA fault was not named"
    assert fd.origin == "region" and fd.region is not None, fd
    assert "region in `model.layers.1.self_attn`" in fd.reason, fd.reason
    assert fd.region["target_ops"][0]["op"] == "Functional.scaled_dot_product_attention"


def test_a_fault_in_cuda_silu_names_silu(golden, tmp_path):
    target = _dump(tmp_path / "t", "cuda", "sdpa", "statistics", fault="Functional.silu:1")
    fd = opdiff.compare(target, golden["statistics"]).first_divergence
    assert fd is not None and fd.name == "Functional.silu.1.forward", fd


def test_fp32_l2_cuda_against_cpu_names_nothing(tmp_path):
    """Same dtype on both sides, aten ops forward and backward: each input explains only the
    error it carries itself, across two devices' kernels."""
    golden = _dump(tmp_path / "g", "cpu", "eager", "tensor", level="L2")
    target = _dump(tmp_path / "t", "cuda", "eager", "tensor", level="L2")
    result = opdiff.compare(target, golden)
    assert result.first_divergence is None, result.verdict
