"""Healthy bf16-autocast runs of Hugging Face models, one AdamW step recorded in statistics: no
op is named, the optimizer's included (noise in, noise out: `opdiff.comparison.noise`).

An attention key-projection bias has a gradient that is mathematically zero (BERT, ViT): bf16
rounding noise on one side, fp32's on the other. AdamW squares it (`exp_avg_sq.addcmul_`) and
divides by it (`addcdiv_`: the first step moves each element by lr * sign(grad)); before the
rule those ops were named. A fault planted in a model op is still named.
"""
import contextlib
import shutil

import pytest
import torch

import opdiff

transformers = pytest.importorskip("transformers")


def _bert():
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg), {"input_ids": torch.randint(0, 64, (2, 8))}


def _vit():
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.ViTModel(cfg), {"pixel_values": torch.randn(2, 3, 16, 16)}


def _decoder(config_class, model_class):
    def build():
        cfg = config_class(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                           max_position_embeddings=32)
        return model_class(cfg), {"input_ids": torch.randint(0, 64, (2, 8))}
    return build


MODELS = {"bert": _bert, "vit": _vit,
          "qwen2": _decoder(transformers.Qwen2Config, transformers.Qwen2Model),
          "llama": _decoder(transformers.LlamaConfig, transformers.LlamaModel),
          "mistral": _decoder(transformers.MistralConfig, transformers.MistralModel)}


def train_step(name, path, *, bf16, fault=None):
    """Forward, backward and one AdamW step, dumped with the default task="statistics"."""
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), level="mix")
    planted = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with planted:
        dbg.start(model)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(**inputs).last_hidden_state
            target = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            (out.float() - target).pow(2).mean().backward()
            opt.step()
        finally:
            dbg.stop()
            dbg.step()
    if fault:
        assert planted.hits == 1
    return path


@pytest.fixture(scope="session")
def hf_runs(tmp_path_factory):
    """name -> (bf16 target dump, fp32 golden dump), made once per session."""
    root = tmp_path_factory.mktemp("hf_optimizer_noise")
    made = {}

    def get(name):
        if name not in made:
            made[name] = (train_step(name, root / f"{name}_bf16", bf16=True),
                          train_step(name, root / f"{name}_fp32", bf16=False))
        return made[name]
    yield get
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", ["bert", "qwen2", *(pytest.param(n, marks=pytest.mark.slow)
                                                     for n in ("vit", "llama", "mistral"))])
def test_healthy_bf16_adamw_step_names_nothing(hf_runs, name):
    target, golden = hf_runs(name)
    result = opdiff.compare(target, golden)
    assert result.first_divergence is None, result.verdict
    assert result.counts["error"] == 0
    steps = [r for r in result.rows if r.op_name.startswith(("Tensor.addc", "Tensor.lerp"))]
    assert steps, "the optimizer's ops were recorded"


def test_healthy_bert_exits_0_with_fail_on_divergence(hf_runs, tmp_path):
    from opdiff.cli import main
    target, golden = hf_runs("bert")
    assert main(["compare", str(target), str(golden), "-o", str(tmp_path / "out"),
                 "--fail-on-divergence"]) == 0


@pytest.mark.parametrize("name,fault", [
    ("bert", dict(op="Functional.linear", call=3, phase="backward", scale=2.0)),
    pytest.param("qwen2", dict(op="Functional.linear", call=2, phase="forward", scale=1.1),
                 marks=pytest.mark.slow),
    pytest.param("vit", dict(op="Functional.linear", call=4, phase="forward", scale=1.1),
                 marks=pytest.mark.slow),
])
def test_planted_fault_is_still_named(hf_runs, tmp_path, name, fault):
    _, golden = hf_runs(name)
    target = train_step(name, tmp_path / "faulty", bf16=True, fault=fault)
    div = opdiff.compare(target, golden).first_divergence
    assert div is not None and div.op == "Functional.linear", div
    assert div.phase == fault["phase"]
