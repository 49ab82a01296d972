"""Hugging Face Trainer, fp32 golden against a `bf16=True` target (CPU autocast, `use_cpu=True`),
each recorded with opdiff's callback at step 0, statistics, level mix: a tiny Llama built from
a config on token data made here. Nothing is wrong in either run, so the compare names nothing:
bf16's rounding is not taken for a culprit."""
from __future__ import annotations

import json

import pytest

import opdiff
from trainerkit import Tokens, tiny_llama, training_args

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def _train(root, bf16: bool):
    from opdiff.integrations.transformers import OpdiffCallback

    model = tiny_llama()
    args = training_args(root, max_steps=2, bf16=bf16)
    callback = OpdiffCallback(dump_path=str(root / "dump"), steps=[0], task="statistics", level="mix")
    transformers.Trainer(model=model, args=args, train_dataset=Tokens(n=4), callbacks=[callback]).train()
    return root / "dump"


def _output_dtypes(dump, op: str) -> set:
    records = [json.loads(line) for line in (dump / "step0/rank0/records.jsonl").open()]
    return {o["dtype"] for r in records if r["op"] == op for o in r.get("outputs") or []
            if isinstance(o, dict) and isinstance(o.get("dtype"), str)}


def test_fp32_against_bf16_compares_clean(tmp_path):
    golden = _train(tmp_path / "golden", bf16=False)
    target = _train(tmp_path / "target", bf16=True)
    # the pair really differs in precision: Trainer on CPU autocasts the linears to bf16
    assert _output_dtypes(golden, "Functional.linear") == {"float32"}
    assert "bfloat16" in _output_dtypes(target, "Functional.linear")
    assert sorted(p.name for p in target.iterdir()) == ["step0"]
    result = opdiff.compare(str(target), str(golden))
    assert result.first_divergence is None, result.first_divergence
    assert not result.verdict.startswith("inconclusive"), result.verdict
    assert result.coverage is not None and result.coverage > 0.9
    assert result.counts["pass"] > 100
