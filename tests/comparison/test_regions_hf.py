"""Hugging Face models whose runs execute different attention ops (eager against SDPA): healthy
pairs name nothing, a fault planted in SDPA names the attention region of its layer with SDPA
in its list, a fault in a later op names that op (dumps: tests/comparison/conftest.py)."""
from __future__ import annotations

import json

import pytest

import opdiff
from opdiff import schemas

SDPA = "Functional.scaled_dot_product_attention"
ATTENTION = {"llama": "model.layers.1.self_attn", "gpt2": "transformer.h.1.attn",
             "qwen2": "model.layers.1.self_attn"}
LATER = {"llama": "Functional.silu", "gpt2": "Functional.gelu", "qwen2": "Functional.silu"}


def _compare(hf_dump, tmp_path, family, task, fault=None, bf16=False):
    golden = hf_dump(family, "eager", task)
    target = hf_dump(family, "sdpa", task, fault=fault, bf16=bf16)
    return opdiff.compare(str(target), str(golden), str(tmp_path / "out"), progress=False)


CASES = [pytest.param(f, t, b, marks=[pytest.mark.slow] if t == "tensor" else [])
         for f in ("llama", "gpt2") for t in ("statistics", "tensor")
         for b in (False, True)] + [("qwen2", "statistics", False)]


@pytest.mark.parametrize("family, task, bf16", CASES)
def test_healthy_pairs_name_nothing(hf_dump, tmp_path, family, task, bf16):
    result = _compare(hf_dump, tmp_path, family, task, bf16=bf16)
    assert result.first_divergence is None, result.first_divergence
    region_rows = [r for r in result.rows if r.region]
    assert region_rows and all(r.result != "unmatched" for r in region_rows)
    assert any(SDPA in (r.target_name or "") for r in region_rows)


@pytest.mark.parametrize("family, task, bf16", CASES)
def test_a_fault_in_sdpa_names_the_attention_region_of_its_layer(hf_dump, tmp_path, family,
                                                                  task, bf16):
    result = _compare(hf_dump, tmp_path, family, task, fault=f"{SDPA}:1", bf16=bf16)
    first = result.first_divergence
    assert first is not None and first.origin == "region", first
    assert first.phase == "forward"
    assert first.region is not None
    assert [o["op"] for o in first.region["target_ops"]][0] == SDPA
    assert "Torch.matmul" in {o["op"] for o in first.region["golden_ops"]}
    assert f"region in `{ATTENTION[family]}`" in first.reason
    assert "local error in this region" in first.reason
    assert first.region["target_ops"][0]["location"]["line"] > 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"]["region"]["target_ops"][0]["op"] == SDPA
    schemas.validate("compare-summary", summary)      # the region is part of the contract
    csv_text = next((tmp_path / "out").glob("compare_result_*.csv")).read_text()
    assert "Region" in csv_text.splitlines()[0]


@pytest.mark.parametrize("family, task", [("llama", "statistics"), ("gpt2", "statistics"),
                                          pytest.param("llama", "tensor",
                                                       marks=pytest.mark.slow)])
def test_a_fault_in_a_later_op_names_that_op(hf_dump, tmp_path, family, task):
    result = _compare(hf_dump, tmp_path, family, task, fault=f"{LATER[family]}:1")
    first = result.first_divergence
    assert first is not None and first.origin == "op", first
    assert first.name == f"{LATER[family]}.1.forward"


def test_rejudge_finds_the_region_again(hf_dump, tmp_path):
    from opdiff.comparison import rejudge
    from opdiff.report.summary import load_summary

    _compare(hf_dump, tmp_path, "llama", "statistics", fault=f"{SDPA}:1")
    again = rejudge(load_summary(str(tmp_path / "out" / "summary.json")))
    first = again.first_divergence
    assert first is not None and first.origin == "region"
    assert first.region is not None and first.region["target_ops"][0]["op"] == SDPA
    assert "model.layers.1.self_attn" in first.reason
    assert again.counts["error"] >= 1
