"""Regions without the cost of whole models: the alignment never pairs a same-named op of other
shapes where the runs execute other ops, capture writes the dataflow the regions are measured
by, dumps without it fall back to module boundaries, and identical op sequences are untouched."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.comparison.align import align
from opdiff.comparison.regions import find_regions
from opdiff.report.console import verdict_line
from opdiff.store.schema import complete

from regionkit import make_dump, without_dataflow


def rec(name, ins, outs, module="Module.attn.Attention.forward.0"):
    op, _, phase = name.rsplit(".", 2)

    def t(shape):
        return {"type": "tensor", "dtype": "float32", "shape": list(shape)}
    return complete({"name": name, "op": op, "phase": phase, "kind": "api", "module": module,
                     "inputs": [t(s) for s in ins], "outputs": [t(s) for s in outs]})


def test_a_same_named_op_of_other_shapes_is_not_paired_where_the_ops_differ():
    """SDPA then an identity reshape against eager attention's repeat_kv reshape then matmuls:
    the two `Tensor.reshape.0` are other ops; the stretch is one region."""
    linear = rec("Functional.linear.0.forward", [(2, 8)], [(2, 8)])
    out = rec("Tensor.transpose.0.forward", [(2, 4, 8)], [(2, 8, 4)])
    target = [linear, rec("Functional.scaled_dot_product_attention.0.forward",
                          [(2, 4, 8)] * 3, [(2, 4, 8)]),
              rec("Tensor.reshape.0.forward", [(2, 4, 8)], [(2, 4, 8)]), out]
    golden = [linear, rec("Tensor.reshape.0.forward", [(2, 2, 2, 8)], [(2, 4, 8)]),
              rec("Torch.matmul.0.forward", [(2, 4, 8)] * 2, [(2, 4, 4)]),
              rec("Functional.softmax.0.forward", [(2, 4, 4)], [(2, 4, 4)]),
              rec("Torch.matmul.1.forward", [(2, 4, 4), (2, 4, 8)], [(2, 4, 8)]), out]
    pairs = align(target, golden)
    assert (2, 1) not in pairs
    assert (0, 0) in pairs and (3, 5) in pairs
    regions = find_regions(pairs, target, golden)
    assert len(regions) == 1
    assert regions[0].target == [1, 2] and regions[0].golden == [1, 2, 3, 4]
    assert regions[0].module == "Module.attn.Attention.forward.0"
    assert regions[0].where == "attn"


def test_identical_sequences_make_no_region():
    ops = [rec("Functional.relu.0.forward", [(2, 3)], [(2, 3)])]
    assert find_regions(align(ops, ops), ops, ops) == []


def _records(path: Path) -> list[dict]:
    files = list(path.rglob("records.jsonl"))
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_capture_names_each_inputs_producer(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with opdiff.dump(model, str(tmp_path / "d"), level="mix", task="statistics"):
        y = model(torch.randn(2, 4))
        (y * 2).sum().backward()
    records = _records(tmp_path / "d")
    by_name = {r["name"]: r for r in records}
    linear, relu = by_name["Functional.linear.0.forward"], by_name["Functional.relu.0.forward"]
    assert relu["inputs"][0]["producer"] == [linear["seq"], 0]
    mul = by_name["Tensor.__mul__.0.forward"]
    assert mul["inputs"][0]["producer"] == [relu["seq"], 0]
    assert linear["inputs"][1]["leaf"] == "parameter" and "producer" not in linear["inputs"][1]
    meta = json.loads(next((tmp_path / "d").rglob("meta.json")).read_text())
    assert meta["dataflow"] == 1


def test_without_dataflow_a_region_is_judged_at_its_module(hf_dump, tmp_path):
    golden = without_dataflow(hf_dump("llama", "eager", "statistics"), tmp_path / "g")
    healthy = without_dataflow(hf_dump("llama", "sdpa", "statistics"), tmp_path / "t")
    faulty = without_dataflow(hf_dump("llama", "sdpa", "statistics",
                                       fault="Functional.scaled_dot_product_attention:1"),
                               tmp_path / "f")
    assert opdiff.compare(str(healthy), str(golden), progress=False).first_divergence is None
    first = opdiff.compare(str(faulty), str(golden), progress=False).first_divergence
    assert first is not None and first.origin == "region"
    assert "model.layers.1.self_attn" in first.reason


def test_identical_op_sequences_keep_their_report(tmp_path):
    golden = make_dump(tmp_path / "g", "llama", "eager", "statistics")
    target = make_dump(tmp_path / "t", "llama", "eager", "statistics",
                       fault="Functional.silu:1")
    result = opdiff.compare(str(target), str(golden), str(tmp_path / "out"), progress=False)
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Functional.silu.1.forward"
    assert not any(r.region for r in result.rows)
    assert result.counts["unmatched"] == 0
    csv_text = next((tmp_path / "out").glob("compare_result_*.csv")).read_text()
    assert "Region" not in csv_text.splitlines()[0]


NORM_CASES = [pytest.param(t, b, marks=[pytest.mark.slow] if t == "tensor" else [])
              for t in ("statistics", "tensor") for b in (False, True)]


@pytest.mark.parametrize("task, bf16", NORM_CASES)
def test_a_fused_norm_against_its_small_ops(hf_dump, task, bf16):
    """HF's RMSNorm (to, pow, mean, add, rsqrt, mul, to, mul) against `F.rms_norm`, fp32 or under
    bf16 autocast: healthy, nothing named and nothing unmatched; a fault in the second layer's
    first norm names that norm's region; a fault in a later op (silu) names that op."""
    golden = hf_dump("llama", "eager", task)
    healthy = opdiff.compare(str(hf_dump("llama", "rms_norm", task, bf16=bf16)), str(golden),
                             progress=False)
    assert healthy.first_divergence is None, healthy.first_divergence
    assert not verdict_line(healthy).startswith("inconclusive"), verdict_line(healthy)
    # (under autocast the loss's `logits.float()` has a backward the fp32 run does not: a
    # region of its op alone, judged through its forward call, that passes)
    assert not [r.target_name for r in healthy.rows if r.result == "unmatched"]
    cast = [r for r in healthy.rows if r.op_name == "Tensor.float.1.backward"]
    assert bool(cast) == bf16 and all(r.region and r.result == "pass" for r in cast), cast
    assert any(r.region for r in healthy.rows)
    faulty = hf_dump("llama", "rms_norm", task, fault="Functional.rms_norm:2", bf16=bf16)
    first = opdiff.compare(str(faulty), str(golden), progress=False).first_divergence
    assert first is not None and first.origin == "region", first
    assert "model.layers.1.input_layernorm" in first.reason
    assert [o["op"] for o in first.region["target_ops"]] == ["Functional.rms_norm"]
    assert "Torch.rsqrt" in {o["op"] for o in first.region["golden_ops"]}
    later = hf_dump("llama", "rms_norm", task, fault="Functional.silu:1", bf16=bf16)
    first = opdiff.compare(str(later), str(golden), progress=False).first_divergence
    assert first is not None and first.origin == "op", first
    assert first.name == "Functional.silu.1.forward"


def test_module_calls_pair_through_a_wrapper_on_one_side():
    """DDP (or any wrapper) puts `module.` in front of every module path of one run: module
    calls still pair, and the ops between them."""
    def mod(name, module=None):
        r = rec(name.rsplit(".", 2)[0] + ".0.forward", [(2, 3)], [(2, 3)], module)
        op = name.rsplit(".", 2)[0]
        r.update(name=name, op=op, kind="module")
        return r
    golden = [rec("Functional.linear.0.forward", [(2, 3)], [(2, 3)], "Module.fc.Linear.forward.0"),
              mod("Module.fc.Linear.forward.0"),
              rec("Functional.relu.0.forward", [(2, 3)], [(2, 3)], "Module.act.ReLU.forward.0"),
              mod("Module.act.ReLU.forward.0")]
    target = [rec("Functional.linear.0.forward", [(2, 3)], [(2, 3)],
                  "Module.module.fc.Linear.forward.0"),
              mod("Module.module.fc.Linear.forward.0"),
              rec("Functional.gelu.0.forward", [(2, 3)], [(2, 3)],
                  "Module.module.act.ReLU.forward.0"),
              mod("Module.module.act.ReLU.forward.0")]
    pairs = align(target, golden)
    assert (1, 1) in pairs and (3, 3) in pairs and (0, 0) in pairs
    regions = find_regions(pairs, target, golden)
    assert [(r.target, r.golden) for r in regions] == [([2], [2])]
