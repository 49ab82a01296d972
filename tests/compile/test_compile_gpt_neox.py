"""A healthy eager GPT-NeoX against Inductor on the CPU, recorded as tensors at L2, is confirmed
healthy with its regions replayed (issue 46, item 4).

GPT-NeoX's LayerNorms make Inductor fuse the embedding with both norms of layer 0 (its parallel
residual reads one input twice): one kernel whose norms come from `var_mean`, a two-result op
the kernel's program could not rebuild (`operator.getitem` is no aten op). The region's chain
replay then asked that kernel for a result its program did not compute and failed with
"KeyError: 'Inductor.cpp_fused_embedding_native_layer_norm_0.0.forward.output.0'". A program
step may now take one result of a multi-result op (`"item"`), and a chain judges the results
a kernel's program computes, not Inductor's own buffers (a norm's mean kept for the backward),
as `opdiff check` does."""
from __future__ import annotations

import pytest
import torch

import opdiff
from compilekit import fresh_compile
from opdiff.comparison.replay.kernels import kernel_tensors
from opdiff.store import open_dump

KERNEL = "Inductor.cpp_fused_embedding_native_layer_norm_0.0.forward"


def gpt_neox() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     max_position_embeddings=32, attn_implementation="eager")
    return transformers.GPTNeoXForCausalLM(cfg).eval()


def _step(path, backend=None):
    import torch._dynamo
    model = gpt_neox()
    run = torch.compile(model, backend=backend) if backend else model
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with fresh_compile(), opdiff.dump(model, str(path), level="L2", task="tensor"):
        run(ids, labels=ids).loss.backward()
    torch._dynamo.reset()
    return path


@pytest.mark.slow
def test_healthy_inductor_gpt_neox_is_confirmed_healthy_and_its_regions_replay(tmp_path):
    compiled, eager = _step(tmp_path / "inductor", "inductor"), _step(tmp_path / "eager")
    result = opdiff.compare(compiled, eager)
    assert result.first_divergence is None and not result.verdict.startswith("inconclusive"), \
        result.verdict
    notes = " ".join(str(n) for n in result.notes)
    assert "replay failed" not in notes and "Region.0.forward" not in notes, notes
    # the fused embedding + norms kernel: its norms are in its program, and replay agrees
    dump = open_dump(compiled / "step0" / "rank0")
    record = next(r for r in dump.records() if r["name"] == KERNEL)
    assert any(step.get("item") is not None for step in record["program"]["steps"])
    replayed = kernel_tensors(record, dump.tensor)
    assert len(replayed.outputs) >= 3          # the embedding and both norms' outputs
    for name, target, exact, _ in replayed.outputs:
        assert torch.allclose(target.double(), exact, rtol=1e-4, atol=1e-5), name
