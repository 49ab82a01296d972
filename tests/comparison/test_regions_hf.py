"""Hugging Face models whose runs execute different attention ops (eager against SDPA): healthy
pairs name nothing, a fault planted in SDPA names the attention region of its layer with SDPA
in its list, a fault in a later op names that op (dumps: tests/comparison/conftest.py)."""
from __future__ import annotations

import json
import re

import pytest

import opdiff
from opdiff import schemas

from regionkit import make_dump

SDPA = "Functional.scaled_dot_product_attention"
ATTENTION = {"llama": "model.layers.1.self_attn", "gpt2": "transformer.h.1.attn",
             "qwen2": "model.layers.1.self_attn"}
LATER = {"llama": "Functional.silu", "gpt2": "Functional.gelu", "qwen2": "Functional.silu"}


def _compare(hf_dump, tmp_path, family, task, fault=None, bf16=False):
    golden = hf_dump(family, "eager", task)
    target = hf_dump(family, "sdpa", task, fault=fault, bf16=bf16)
    return opdiff.compare(str(target), str(golden), str(tmp_path / "out"), progress=False)


# every family, statistics and tensor dumps, fp32 eager golden against fp32 or bf16-autocast SDPA
CASES = [pytest.param(f, t, b, marks=[pytest.mark.slow] if t == "tensor" else [])
         for f in ("llama", "gpt2", "qwen2") for t in ("statistics", "tensor")
         for b in (False, True)]


# What only one run executes, each op with no twin: the SDPA path's attention output is already
# contiguous after its transpose, so `.contiguous()` is a no-op there, one that only SDPA's code
# calls (GPT-2, forward), or one that both call and only eager's records a backward for (Llama,
# Qwen2: a no-op makes no autograd node); under autocast the target's `.float()` of bf16 logits
# is a cast whose backward the fp32 golden, where it is a no-op, never runs. The dataflow proves
# each one's boundary (paired ops make what it reads and read what it makes, in backward through
# its forward call, or golden's forward call's target twin): each is a one-sided region of its
# own that passes (comparison/region_onesided.py), none is unmatched.
NO_TWIN = {"llama": ["Tensor.contiguous.0.backward", "Tensor.contiguous.2.backward"],
           "gpt2": ["Tensor.contiguous.0.forward", "Tensor.contiguous.2.forward"],
           "qwen2": ["Tensor.contiguous.0.backward", "Tensor.contiguous.2.backward"]}
FLOAT_BACKWARD = {"llama": "Tensor.float.1.backward", "gpt2": "Tensor.float.0.backward",
                  "qwen2": "Tensor.float.1.backward"}


@pytest.mark.parametrize("family, task, bf16", CASES)
def test_healthy_pairs_name_nothing(hf_dump, tmp_path, family, task, bf16):
    result = _compare(hf_dump, tmp_path, family, task, bf16=bf16)
    assert result.first_divergence is None, result.first_divergence
    region_rows = [r for r in result.rows if r.region]
    assert region_rows and all(r.result != "unmatched" for r in region_rows)
    assert any(SDPA in (r.target_name or "") for r in region_rows)
    # the mask ops eager attention builds, the mask it passes into the attention and decoder
    # layer calls and the attention weights it returns are the attention region's, not unmatched;
    # the ops with no twin are regions of their own
    assert result.counts["unmatched"] == 0, [(r.target_name, r.golden_name) for r in result.rows
                                             if r.result == "unmatched"]
    alone = {r.region: set() for r in region_rows}
    for r in region_rows:
        alone[r.region].add(r.op_name)
    expected = NO_TWIN[family] + ([FLOAT_BACKWARD[family]] if bf16 else [])
    one_sided = sorted(op for ops in alone.values() if len(ops) == 1 for op in ops)
    assert one_sided == sorted(expected), alone
    judged = [r for r in region_rows if r.op_name in expected]
    assert judged and all(r.result == "pass" and "not judged" not in r.reason
                          for r in judged), judged
    covered = {r.golden_name for r in region_rows if r.kind == "module"}
    attention = ATTENTION[family].replace(".1.", ".0.")
    assert any(n and attention in n and n.endswith(".output.1") for n in covered), covered


def test_a_fault_in_an_op_only_golden_records_a_backward_for_names_its_region(hf_dump, tmp_path):
    # eager Llama's `.contiguous()` of the attention output copies (SDPA's is a no-op, with no
    # backward): 2% planted in golden's gradient through it is named as a region of golden's op
    # alone, judged through the target's call of that op
    golden = make_dump(tmp_path / "eager_bad", "llama", "eager", "statistics",
                       fault="Tensor.contiguous:2", phase="backward")
    result = opdiff.compare(str(hf_dump("llama", "sdpa", "statistics")), str(golden),
                            progress=False)
    first = result.first_divergence
    assert first is not None and first.origin == "region" and first.phase == "backward", first
    assert first.region["target_ops"] == []
    assert [o["name"] for o in first.region["golden_ops"]] == ["Tensor.contiguous.2.backward"]
    assert first.reason.startswith(f"region in `{ATTENTION['llama']}` (backward; target: no "
                                   "op; golden: `Tensor.contiguous` at "), first.reason
    assert "only the golden run executes ops here" in first.reason
    assert "local error in this region" in first.reason
    assert first.location is None       # (no target line: golden's is listed as golden's)
    assert first.region["golden_locations"][0]["file"].endswith("modeling_llama.py")
    assert result.counts["unmatched"] == 0
    from opdiff.comparison import rejudge
    again = rejudge(result, {}).first_divergence
    assert again is not None and (again.name, again.reason, again.location) == \
        (first.name, first.reason, None)


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
    assert [i["name"] for i in first.region["inputs"]] == ["query", "key", "value"]
    assert first.region["target_locations"] and first.region["golden_locations"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"]["region"]["target_ops"][0]["op"] == SDPA
    schemas.validate("compare-summary", summary)      # the region is part of the contract
    csv_text = next((tmp_path / "out").glob("compare_result_*.csv")).read_text()
    assert "Region" in csv_text.splitlines()[0]


@pytest.mark.parametrize("family, task, bf16", CASES)
def test_a_fault_in_a_later_op_names_that_op(hf_dump, tmp_path, family, task, bf16):
    result = _compare(hf_dump, tmp_path, family, task, fault=f"{LATER[family]}:1", bf16=bf16)
    first = result.first_divergence
    assert first is not None and first.origin == "op", first
    assert first.name == f"{LATER[family]}.1.forward"


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rejudge_finds_the_region_again(hf_dump, tmp_path, family):
    from opdiff.comparison import rejudge
    from opdiff.report.summary import load_summary

    original = _compare(hf_dump, tmp_path, family, "statistics", fault=f"{SDPA}:1")
    again = rejudge(load_summary(str(tmp_path / "out" / "summary.json")),
                    {"tolerance": {"fp32": 0.005}})
    first = again.first_divergence
    assert first is not None and first.origin == "region"
    assert first.region is not None and first.region["target_ops"][0]["op"] == SDPA
    assert f"region in `{ATTENTION[family]}` (forward;" in first.reason
    assert again.counts["error"] >= 1
    # rows.jsonl keeps no dataflow, but the region's saved facts keep how it read its inputs
    # (comparison/region_facts.py): named as the compare named them; both sides' lines come
    # back from the rows' stacks; GPT-2's attention weights, a golden module call's tensor the
    # region covers, are not listed as one of its ops
    assert [i["name"] for i in first.region["inputs"]] == ["query", "key", "value"]
    assert all(i["agrees"] for i in first.region["inputs"])
    was = original.first_divergence
    assert (first.name, first.reason, first.region, first.tensor, first.module) == \
        (was.name, was.reason, was.region, was.tensor, was.module)
    assert first.region["target_locations"][0]["file"].endswith("sdpa_attention.py")
    assert first.region["golden_locations"][0]["file"].endswith(f"modeling_{family}.py")


def _rows_jsonl(path):
    lines = path.read_text().splitlines()
    fields = json.loads(lines[0])["fields"]
    return [dict(zip(fields, json.loads(line))) for line in lines[1:]]


def test_the_users_command_line_names_layer_0s_attention_region(hf_dump, tmp_path, capsys):
    """The issue's case end to end, as a user runs it: `opdiff compare TARGET GOLDEN -o OUT` on a
    Llama whose SDPA in layer 0 is 2% off against eager attention."""
    import csv

    from opdiff.cli import main

    golden = hf_dump("llama", "eager", "statistics")
    target = hf_dump("llama", "sdpa", "statistics", fault=f"{SDPA}:0")
    out = tmp_path / "out"
    assert main(["compare", str(target), str(golden), "-o", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "First divergence: Region.0.forward (step 0, rank 0)" in text, text
    assert f"region in `model.layers.0.self_attn` (forward; target: `{SDPA}`" in text, text
    assert "local error in this region" in text
    assert "sdpa_attention.py:" in text and "scaled_dot_product_attention(" in text
    # golden's list and line are its attention's, not those of the mask that eager attention
    # builds in LlamaModel (those ops join the region, they feed nothing else) ...
    headline = text[text.index("region in `"):text.index("): the two runs")]
    assert "`Torch.matmul`" in headline, headline
    assert " at modeling_llama.py:" in headline and "masking_utils" not in headline, headline
    # both sides' lines in the sentence, the inputs it agreed on by the names SDPA reads them as
    assert re.search(r"`Tensor\.reshape` at sdpa_attention\.py:\d+-\d+; golden: ", headline)
    assert (f"the inputs' statistics agree exactly (`query`, `key`, `value` of `{SDPA}`), the "
            f"output's do not") in text, text
    # and as lines a user can click: one per side and file, each op's line under it
    lines = text.splitlines()
    target_line = next(x for x in lines if x.startswith("  target: "))
    golden_line = next(x for x in lines if x.startswith("  golden: "))
    assert re.fullmatch(r"  target: \S+/transformers/integrations/sdpa_attention\.py:\d+-\d+",
                        target_line), target_line
    assert re.fullmatch(r"  golden: \S+/transformers/models/llama/modeling_llama\.py:\d+-\d+",
                        golden_line), golden_line
    under_golden = lines[lines.index(golden_line) + 1:]
    assert any("> " in x and "torch.matmul(" in x for x in under_golden[:12]), under_golden
    summary = json.loads((out / "summary.json").read_text())
    schemas.validate("compare-summary", summary)
    first = summary["first_divergence"]
    assert first["origin"] == "region" and first["name"] == "Region.0.forward"
    assert first["module"] == "Module.model.layers.0.self_attn.LlamaAttention.forward.0"
    assert first["location"]["file"].endswith("sdpa_attention.py")
    sdpa = first["region"]["target_ops"][0]
    assert sdpa["name"] == f"{SDPA}.0.forward" and sdpa["location"]["line"] > 0
    # the inputs by name, each side's source lines: the target's SDPA, golden's attention
    assert [(i["name"], i["op"], i["agrees"]) for i in first["region"]["inputs"]] == \
        [(n, SDPA, True) for n in ("query", "key", "value")]
    assert first["region"]["target_locations"][0] == {
        k: first["location"][k] for k in ("file", "line", "code")}
    golden_lines = first["region"]["golden_locations"]
    assert golden_lines and all(x["file"].endswith("modeling_llama.py") for x in golden_lines)
    assert any("torch.matmul(" in x["code"] for x in golden_lines), golden_lines
    assert golden_lines == sorted(golden_lines, key=lambda x: x["line"])
    # golden's side with its own source lines: eager attention's matmuls and softmax
    golden_ops = {o["op"]: o["location"] for o in first["region"]["golden_ops"]}
    for op in ("Torch.matmul", "Functional.softmax"):
        assert golden_ops[op]["file"].endswith("modeling_llama.py") and golden_ops[op]["line"] > 0
    # ... which summary.json still lists, in execution order, each with its module call
    golden_listed = first["region"]["golden_ops"]
    assert golden_listed[0]["op"] == "Torch.arange"
    assert golden_listed[0]["module"] == "Module.model.LlamaModel.forward.0"
    assert golden_listed[-1]["module"] == first["module"]
    # the CSV's Region column, rows.jsonl's region field, summary.json's facts of the region
    label = "region 0 in model.layers.0.self_attn"
    with next(out.glob("compare_result_*.csv")).open() as f:
        csv_rows = list(csv.DictReader(f))
    assert {r["Region"] for r in csv_rows if r["NPU Name"].startswith(f"{SDPA}.0.forward")} == {label}
    rows = _rows_jsonl(out / "rows.jsonl")
    assert {r["region"] for r in rows if (r["target_name"] or "").startswith(f"{SDPA}.0.forward")} \
        == {label}
    (region,) = [r for f in summary["facts"] for r in f["regions"] if r["number"] == 0]
    assert (region["phase"], region["where"], region["how"]) == \
        ("forward", "model.layers.0.self_attn", "dataflow")
    assert [r[1:] for r in region["readers"]] == [[SDPA, k, ""] for k in ("0", "1", "2")]
    assert not any(r["boundary"] for r in rows)     # (what older files marked rows with)
    inputs = [r for r in rows if r["target_name"] in region["inputs"]]
    outputs = [r for r in rows if r["target_name"] in region["outputs"]]
    assert len(inputs) >= 3 and all(r["result"] == "pass" for r in inputs), inputs  # q, k, v
    assert outputs and all(r["result"] == "error" for r in outputs), outputs
