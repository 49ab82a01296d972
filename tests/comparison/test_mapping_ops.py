"""Op-to-op lines of the mapping file (`ops:`, and msprobe's data_mapping.yaml as it is): forced
pairs (comparison/forced.py) on real dumps of an attention block that runs
`F.scaled_dot_product_attention` on the target side and eager `matmul -> softmax -> matmul` on
the golden one, with faults planted in SDPA or upstream of it."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import opdiff
from opdiff.cli import main
from opdiff.comparison.forced import NOT_JUDGED
from opdiff.comparison.mapping import MappingError, load
from opdiff.comparison.rejudge import rejudge
from opdiff.report.summary import load_summary

from factskit import as_older
from msprobekit import write_msprobe
from regionkit import block_dump

SDPA = "Functional.scaled_dot_product_attention.0.forward"
LAST_MATMUL = "Torch.matmul.1.forward"      # eager attention's `weights @ v`

# msprobe's data_mapping.yaml, in its own format (comments, tensor names, `N/A` for no partner)
DATA_MAPPING = f"""# API
{SDPA}.output.0: {LAST_MATMUL}.output.0
{SDPA}.input.2: {LAST_MATMUL}.input.1
Torch.matmul.0.forward.output.0: N/A
# Module
Module.attn.Attention.forward.0.output.0: Module.attn.Attention.forward.0.output.0
"""


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mapping_ops")
    block_dump(root / "eager", fused=False)
    block_dump(root / "sdpa", fused=True)
    block_dump(root / "sdpa_bad", fused=True, fault="Functional.scaled_dot_product_attention")
    block_dump(root / "q_bad", fused=True, fault="Functional.linear")    # the q projection
    block_dump(root / "sdpa_bad_backward", fused=True, fault="Functional.scaled_dot_product_attention",
          phase="backward")
    return root


def _write(tmp_path: Path, text: str, name: str = "data_mapping.yaml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def _rows(result, op_name: str) -> list:
    return [r for r in result.rows if r.op_name == op_name]


def test_msprobe_data_mapping_pairs_sdpa_with_the_eager_matmul(dumps, tmp_path):
    f = _write(tmp_path, DATA_MAPPING)
    healthy = opdiff.compare(dumps / "sdpa", dumps / "eager", progress=False, mapping=f)
    assert healthy.first_divergence is None
    # (the backward region is judged through its gradients: test_region_backward.py)
    assert not [n for n in healthy.notes if n.startswith("inconclusive")], healthy.notes
    assert not [n for n in healthy.notes if "paired by the mapping file" in n]
    assert not [n for n in healthy.notes if f"{f}:2" in n or f"{f}:3" in n]
    rows = _rows(healthy, SDPA)
    # only the listed tensors, each against the golden tensor the file names
    assert [(r.target_name, r.golden_name) for r in rows] == [
        (f"{SDPA}.input.2", f"{LAST_MATMUL}.input.1"),
        (f"{SDPA}.output.0", f"{LAST_MATMUL}.output.0")]
    assert all(r.result == "pass" and r.metrics and not r.region for r in rows)
    assert all(r.metrics["Cosine"] > 0.9999 for r in rows)
    # eager attention's first matmul and softmax feed only the pair: covered by it
    assert healthy.counts["unmatched"] == 0
    (softmax,) = [r for r in healthy.rows if r.golden_name == "Torch.softmax.0.forward.output.0"]
    assert softmax.result == "pass" and softmax.target_name is None
    assert softmax.reason == (f"feeds only the mapping file's pair {SDPA} against {LAST_MATMUL} "
                              f"({f}:2, 3): judged through its tensors")

    bare = opdiff.compare(dumps / "sdpa_bad", dumps / "eager", progress=False)
    assert bare.first_divergence is not None and bare.first_divergence.name.startswith("Region.")
    faulty = opdiff.compare(dumps / "sdpa_bad", dumps / "eager", progress=False, mapping=f)
    found = faulty.first_divergence
    assert found is not None and found.name == SDPA
    # judged against the inputs it read, measured where q and k were made (its tensor list
    # holds only v and the output)
    assert "inputs agree" in found.reason


# msprobe's data_mapping.yaml lets one target op stand for several golden ops: SDPA's q against
# eager attention's first matmul, k against the transpose of it, v and the output against the
# last matmul
TWO_OPS = f"""{SDPA}.input.0: Torch.matmul.0.forward.input.0
{SDPA}.input.1: Tensor.transpose.3.forward.input.0
{SDPA}.input.2: {LAST_MATMUL}.input.1
{SDPA}.output.0: {LAST_MATMUL}.output.0
"""


@pytest.mark.parametrize("target, culprit", [("sdpa", None), ("sdpa_bad", SDPA),
                                             ("q_bad", "Functional.linear.0.forward")])
def test_one_target_op_against_several_golden_ops(dumps, tmp_path, target, culprit):
    f = _write(tmp_path, TWO_OPS)
    result = opdiff.compare(dumps / target, dumps / "eager", tmp_path / "out", progress=False,
                            mapping=f)
    rows = _rows(result, SDPA)
    # each tensor against the golden tensor its line names, in whichever golden record
    assert [(r.target_name[len(SDPA):], r.golden_name) for r in rows] == [
        (".input.0", "Torch.matmul.0.forward.input.0"),
        (".input.1", "Tensor.transpose.3.forward.input.0"),
        (".input.2", f"{LAST_MATMUL}.input.1"), (".output.0", f"{LAST_MATMUL}.output.0")]
    assert all(r.metrics for r in rows)
    assert result.counts["unmatched"] == 0
    # a golden tensor the pair takes from another record is shown once, in the pair's row
    shown = [r.golden_name for r in result.rows if r.golden_name]
    assert len(shown) == len(set(shown)), sorted(n for n in shown if shown.count(n) > 1)
    (softmax,) = [r for r in result.rows if r.golden_name == "Torch.softmax.0.forward.output.0"]
    assert softmax.reason == (f"feeds only the mapping file's pair {SDPA} against "
                              f"Tensor.transpose.3.forward, Torch.matmul.0.forward and "
                              f"{LAST_MATMUL} ({f}:1, 2, 3, 4): judged through its tensors")
    found = result.first_divergence
    assert (found.name if found else None) == culprit
    if target == "sdpa_bad":
        assert found.reason.startswith("inputs agree")
    if target == "q_bad":       # q differs where SDPA reads it, so SDPA is not named
        assert rows[0].error > 1e-3 and rows[-1].error > 1e-3 and rows[-1].result != "error"
    for again in (rejudge(result), rejudge(load_summary(result.files["summary"]))):
        assert [(r.target_name, r.golden_name, r.result) for r in again.rows] == \
            [(r.target_name, r.golden_name, r.result) for r in result.rows]
        assert (again.first_divergence.name if again.first_divergence else None) == culprit


def test_a_fault_upstream_is_not_blamed_on_the_forced_pair(dumps, tmp_path):
    f = _write(tmp_path, DATA_MAPPING)
    result = opdiff.compare(dumps / "q_bad", dumps / "eager", progress=False, mapping=f)
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Functional.linear.0.forward"
    # SDPA's output differs (inherited from q), and SDPA is not named for it
    (out,) = [r for r in _rows(result, SDPA) if r.target_name.endswith("output.0")]
    assert out.error > 1e-3 and out.result != "error"


def test_our_ops_section_a_whole_record_line_and_a_shape_mismatch(dumps, tmp_path):
    f = _write(tmp_path, f"ops:\n  {SDPA}: {LAST_MATMUL}\n", "pairs.yaml")
    result = opdiff.compare(dumps / "sdpa", dumps / "eager", progress=False, mapping=f)
    rows = {r.target_name[len(SDPA):]: r for r in _rows(result, SDPA)}
    # a whole-record line compares the tensors both hold under one name
    assert set(rows) == {".input.0", ".input.1", ".output.0"}
    assert rows[".input.0"].result == "error"           # q [2, 2, 5, 8] vs weights [2, 2, 5, 5]
    assert "shapes differ: [2, 2, 5, 8] vs [2, 2, 5, 5]" in rows[".input.0"].reason
    assert rows[".output.0"].golden_name == f"{LAST_MATMUL}.output.0"
    assert rows[".output.0"].metrics["Cosine"] > 0.9999

    listed = _write(tmp_path, f"ops:\n  {SDPA}.input.0: {LAST_MATMUL}.input.0\n", "shape.yaml")
    result = opdiff.compare(dumps / "sdpa", dumps / "eager", progress=False, mapping=listed)
    (row,) = _rows(result, SDPA)
    assert row.result == "error" and row.reason.startswith("shapes differ")
    assert result.first_divergence is None


def test_without_dataflow_a_forced_pair_is_not_judged_on_its_outputs_alone(dumps, tmp_path):
    # msprobe dumps hold no dataflow: SDPA's q and k are neither listed nor traceable
    target = write_msprobe(dumps / "sdpa_bad" / "step0" / "rank0", tmp_path / "npu")
    golden = write_msprobe(dumps / "eager" / "step0" / "rank0", tmp_path / "gpu")
    f = _write(tmp_path, f"{SDPA}.output.0: {LAST_MATMUL}.output.0\n")
    result = opdiff.compare(target, golden, progress=False, mapping=f)
    (out,) = _rows(result, SDPA)
    assert out.golden_name == f"{LAST_MATMUL}.output.0" and NOT_JUDGED in out.reason
    # never SDPA on its outputs alone: the pair says it cannot tell
    assert result.first_divergence is None
    assert any(n.startswith("inconclusive") and SDPA in n for n in result.notes)


def test_loading_msprobe_lines(tmp_path):
    m = load(_write(tmp_path, DATA_MAPPING))
    assert [(r.kind, r.old, r.new, r.parts, r.line) for r in m.rules] == [
        ("op", SDPA, LAST_MATMUL, (".output.0", ".output.0"), 2),
        ("op", SDPA, LAST_MATMUL, (".input.2", ".input.1"), 3),
        ("module", "attn", "attn", (), 6)]         # line 4 (`N/A`: no partner) is left out
    assert pickle.loads(pickle.dumps(m)) == m
    assert m.rules[0].text == f"{SDPA}.output.0: {LAST_MATMUL}.output.0"


@pytest.mark.parametrize("text, line, words", [
    (f"Functional.nothing.0.forward.output.0: {LAST_MATMUL}.output.0\n", 1,
     "names no record of the target dump"),
    (f"{LAST_MATMUL}.output.0: {SDPA}.output.0\n", 1, "the golden dump holds it"),
    (f"{SDPA}.output.3: {LAST_MATMUL}.output.0\n", 1, "names no tensor"),
    (f"{SDPA}.output.0: {LAST_MATMUL}\n", 1, "on both sides"),
    (f"{SDPA}: {LAST_MATMUL}\n{SDPA}.input.0: Torch.matmul.0.forward.input.0\n",
     2, "a record pairs with one record (with several only through lines that name tensors)"),
    (f"{SDPA}.input.0: Torch.matmul.0.forward.input.0\n{SDPA}.output.0: {LAST_MATMUL}.output.0\n"
     f"{SDPA}: Torch.matmul.0.forward\n",
     3, "a line naming whole records cannot say which holds which tensor"),
    (f"{SDPA}.output.0: {LAST_MATMUL}.output.0\n"
     f"Functional.linear.3.forward.input.0: {LAST_MATMUL}.output.0\n", 2,
     f"'{LAST_MATMUL}' is paired with another record on line 1 already"),
    (f"{SDPA}.output.0: {LAST_MATMUL}.output.0\n{SDPA}.input.2: {LAST_MATMUL}.output.0\n",
     2, "a tensor pairs with one tensor"),
    (f"{SDPA}.output.0: {LAST_MATMUL}.output.0\n"
     f"Functional.linear.0.forward: Functional.linear.4.forward\n", 2, "other order"),
    ("Functional.linear.0.forward: Module.attn.q.Linear.forward.0\n", 1, "names no op call"),
    ("ops:\n  - Functional.linear.0.forward\n", 2, "'ops:' takes"),
    (f"modules:\n  {SDPA}: {LAST_MATMUL}\n", 2, "under 'ops:'"),
    (f"ignore:\n  - Functional.scaled_dot_product_attention\nops:\n  {SDPA}: {LAST_MATMUL}\n",
     4, "an 'ignore:' line drops it"),
])
def test_a_bad_op_line_exits_2_naming_the_file_and_line(dumps, tmp_path, capsys, text, line,
                                                         words):
    f = _write(tmp_path, text)
    assert main(["compare", str(dumps / "sdpa"), str(dumps / "eager"), "--map", str(f),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{f}:{line}:" in err and words in err, err
    with pytest.raises(MappingError):
        opdiff.compare(dumps / "sdpa", dumps / "eager", progress=False, mapping=f)


@pytest.mark.parametrize("target", ["q_bad", "sdpa_bad"])
def test_a_rejudged_result_judges_the_forced_pair_as_the_compare_did(dumps, tmp_path, target):
    original = opdiff.compare(dumps / target, dumps / "eager", tmp_path / "out", progress=False,
                              mapping=_write(tmp_path, DATA_MAPPING), replay="off")
    # (SDPA's inherited error is a warning only because its q and k are its inputs too)
    (facts,) = original.facts       # SDPA's q and k, measured where the target made them
    assert [(f.name, len(f.inputs), f.unjudged) for f in facts.forced] == [(SDPA, 2, ())]
    loaded = load_summary(original.files["summary"])
    for again in (rejudge(original), rejudge(loaded), rejudge(as_older(loaded))):
        assert [(r.target_name, r.golden_name, r.result) for r in again.rows] == \
            [(r.target_name, r.golden_name, r.result) for r in original.rows]
        assert again.first_divergence.name == original.first_divergence.name


def test_a_rejudged_result_keeps_a_forced_pair_unjudged(dumps, tmp_path):
    target = write_msprobe(dumps / "sdpa_bad" / "step0" / "rank0", tmp_path / "npu")
    golden = write_msprobe(dumps / "eager" / "step0" / "rank0", tmp_path / "gpu")
    f = _write(tmp_path, f"{SDPA}.output.0: {LAST_MATMUL}.output.0\n")
    original = opdiff.compare(target, golden, tmp_path / "out", progress=False, mapping=f)
    (facts,) = original.facts
    assert [(f.name, f.inputs, len(f.unjudged)) for f in facts.forced] == [(SDPA, (), 1)]
    loaded = load_summary(original.files["summary"])
    for again in (rejudge(original), rejudge(loaded), rejudge(as_older(loaded))):
        assert again.first_divergence is None
        (out,) = _rows(again, SDPA)
        assert NOT_JUDGED in out.reason and out.reason.count(NOT_JUDGED) == 1


def test_a_llama_port_with_each_layers_sdpa_mapped_to_eager_attention(hf_dump, tmp_path):
    # Hugging Face Llama (2 layers, from a config): SDPA against eager attention; eager's
    # Torch.matmul.1/.3 are layer 0's and layer 1's `weights @ v`
    f = _write(tmp_path, f"ops:\n  {SDPA}.output.0: {LAST_MATMUL}.output.0\n"
                         f"  Functional.scaled_dot_product_attention.1.forward.output.0: "
                         f"Torch.matmul.3.forward.output.0\n", "pairs.yaml")
    golden = hf_dump("llama", "eager", "tensor")
    faulty = hf_dump("llama", "sdpa", "tensor", fault="Functional.scaled_dot_product_attention:1")
    result = opdiff.compare(faulty, golden, progress=False, mapping=f)
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Functional.scaled_dot_product_attention.1.forward"
    assert "inputs agree" in result.first_divergence.reason
    # a healthy bf16 SDPA against fp32 eager attention names nothing
    healthy = opdiff.compare(hf_dump("llama", "sdpa", "tensor", bf16=True), golden,
                             progress=False, mapping=f)
    assert healthy.first_divergence is None
    assert not [n for n in healthy.notes if "paired by the mapping file" in n]
    mapped = [r for r in healthy.rows if r.golden_name == "Torch.matmul.3.forward.output.0"]
    assert len(mapped) == 1 and mapped[0].target_dtype == "bfloat16" and mapped[0].metrics


def test_a_backward_line_and_replay_name_a_fault_in_sdpa_backward(dumps, tmp_path):
    # SDPA's gradient of v against the eager `weights @ v` matmul's gradient of v
    f = _write(tmp_path, f"{SDPA[:-7]}backward.output.2: {LAST_MATMUL[:-7]}backward.output.1\n")
    result = opdiff.compare(dumps / "sdpa_bad_backward", dumps / "eager", progress=False,
                            mapping=f)
    found = result.first_divergence
    assert found is not None and found.name == "Functional.scaled_dot_product_attention.0.backward"
    # the gradients it reads are not traced back here: not judged by the comparison, replay
    # (its own inputs, float64) names it
    assert found.reason.startswith(f"compared with golden it is {NOT_JUDGED}, but replayed")
    (row,) = _rows(result, found.name)
    assert row.golden_name == "Torch.matmul.1.backward.output.1" and row.metrics
    healthy = opdiff.compare(dumps / "sdpa", dumps / "eager", progress=False, mapping=f)
    assert healthy.first_divergence is None
