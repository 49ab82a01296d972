"""`concat:` on real Hugging Face models: Phi-3 (one fused `qkv_proj` and one `gate_up_proj`
per layer) against Llama (q/k/v and gate/up projections) holding the same weights, built from
configs. With a mapping file that renames Phi-3's classes and joins the projections, the fused
calls, their weights and gradients are compared: a fault in layer 1's fused qkv projection names
the region inside that call, a wrongly loaded fused weight is named as that parameter, a fault
in a later op names that op, and the healthy pair names nothing. (Both embeddings have the same
`padding_idx`: Phi-3's config sets one, so the Llama's does too.)"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import pytest
import torch

import opdiff
from opdiff.report.console import verdict_line
from opdiff.testing import inject_fault

MAPPING = """modules:
  Phi3Model: LlamaModel
  Phi3DecoderLayer: LlamaDecoderLayer
  Phi3Attention: LlamaAttention
  Phi3MLP: LlamaMLP
  Phi3RMSNorm: LlamaRMSNorm
  Phi3RotaryEmbedding: LlamaRotaryEmbedding
  activation_fn: act_fn
concat:
  qkv_proj: [q_proj, k_proj, v_proj]
  gate_up_proj: {golden: [gate_proj, up_proj], dim: -1}
"""
# Phi-3's Functional.linear calls per layer: qkv_proj, o_proj, gate_up_proj, down_proj
QKV_LAYER1, DOWN_LAYER1 = "Functional.linear:4", "Functional.linear:7"


def _models():
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
              attn_implementation="eager", rms_norm_eps=1e-6, pad_token_id=0)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    phi = transformers.Phi3ForCausalLM(transformers.Phi3Config(**kw)).eval()
    weights = llama.state_dict()
    fused = {}
    for name, w in weights.items():
        if ".q_proj." in name:
            fused[name.replace("q_proj", "qkv_proj")] = torch.cat(
                [w, weights[name.replace("q_proj", "k_proj")], weights[name.replace("q_proj", "v_proj")]])
        elif ".gate_proj." in name:
            fused[name.replace("gate_proj", "gate_up_proj")] = torch.cat(
                [w, weights[name.replace("gate_proj", "up_proj")]])
        elif not any(p in name for p in (".k_proj.", ".v_proj.", ".up_proj.")):
            fused[name] = w
    phi.load_state_dict(fused)
    return llama, phi


def _dump(model, path: Path, fault: Optional[str] = None) -> Path:
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (2, 8))
    planted = nullcontext()
    if fault:
        op, call = fault.split(":")
        planted = inject_fault(op=op, call=int(call), scale=1.02)
    with planted:
        with opdiff.dump(model, str(path), level="mix", task="statistics"):
            model(ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi3")
    llama, phi = _models()
    made = {"golden": _dump(llama, root / "llama"), "healthy": _dump(phi, root / "phi3"),
            "qkv": _dump(phi, root / "qkv", QKV_LAYER1),
            "later": _dump(phi, root / "later", DOWN_LAYER1)}
    weight = phi.model.layers[1].mlp.gate_up_proj.weight
    with torch.no_grad():
        weight[70, 3] += 0.05           # in the up half
    made["weight"] = _dump(phi, root / "weight")
    (root / "pairs.yaml").write_text(MAPPING)
    made["map"] = root / "pairs.yaml"
    return made


def _compare(dumps, case: str):
    return opdiff.compare(str(dumps[case]), str(dumps["golden"]), progress=False,
                          mapping=dumps["map"])


def test_the_healthy_pair_names_nothing_and_compares_the_fused_weights(dumps):
    result = _compare(dumps, "healthy")
    assert result.first_divergence is None, result.first_divergence
    # the backward regions are judged at the renamed MLP and attention calls (measured by the
    # names the target recorded), so nothing is left unjudged
    assert not verdict_line(result).startswith("inconclusive"), verdict_line(result)
    for layer in (0, 1):
        for module in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
            call = f"Module.model.layers.{layer}.{module}.Linear"
            for name in (f"{call}.forward.0.output.0", f"{call}.forward.0.parameters.weight",
                         f"{call}.parameters_grad.0.weight"):
                rows = [r for r in result.rows if r.target_name == name]
                assert len(rows) == 1 and rows[0].golden_name == name, name
                assert rows[0].result == "pass", rows[0]
    assert not [n for n in result.notes if "never used" in n], result.notes


def test_a_fault_in_the_fused_qkv_projection_names_its_region(dumps):
    result = _compare(dumps, "qkv")
    fd = result.first_divergence
    assert fd is not None and fd.origin == "region", verdict_line(result)
    assert fd.phase == "forward"
    assert "region in `model.layers.1.self_attn.qkv_proj`" in fd.reason, fd.reason
    assert [o["op"] for o in fd.region["golden_ops"]] == ["Functional.linear"] * 3
    assert "were not compared" not in fd.reason


def test_a_wrongly_loaded_fused_weight_is_named(dumps):
    fd = _compare(dumps, "weight").first_divergence
    assert fd is not None and fd.origin == "parameter", fd
    assert "parameter model.layers.1.mlp.gate_up_proj.weight differs" in fd.reason, fd.reason


def test_a_fault_in_a_later_op_names_that_op(dumps):
    fd = _compare(dumps, "later").first_divergence
    assert fd is not None and fd.origin == "op", fd
    assert fd.name == "Functional.linear.7.forward"
