"""rejudge: a result judged again with other thresholds from the metrics its rows carry."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opdiff
from opdiff.api import compare
from opdiff.comparison import rejudge
from opdiff.comparison.rejudge import NOTE, measurement
from opdiff.comparison.result import LOCAL, NUMBER, Note, TensorRow, CompareResult, note_kind
from opdiff.report import write_outputs
from opdiff.report.summary import load_summary

from dumpkit import cnn_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rejudge")
    cnn_run(root / "golden" / "step0" / "rank0")
    cnn_run(root / "golden" / "step1" / "rank0", seed=1)
    cnn_run(root / "fault" / "step0" / "rank0", faults=[("Functional.conv2d", 1, 1 + 1e-3)])
    cnn_run(root / "bf16" / "step0" / "rank0", bf16=True)
    cnn_run(root / "bf16" / "step1" / "rank0", bf16=True, seed=1,
            faults=[("Functional.linear", 0, 1.05)])
    return root


def _same(a: CompareResult, b: CompareResult):
    assert [(r.target_name, r.result, r.accuracy_reached) for r in a.rows] == \
        [(r.target_name, r.result, r.accuracy_reached) for r in b.rows]
    assert a.counts == b.counts
    fa, fb = a.first_divergence, b.first_divergence
    assert (fa and (fa.name, fa.kind, fa.step, fa.rank, fa.tensor)) == \
        (fb and (fb.name, fb.kind, fb.step, fb.rank, fb.tensor))


def test_the_same_thresholds_give_the_same_verdicts(runs):
    original = compare(runs / "fault" / "step0" / "rank0", runs / "golden" / "step0" / "rank0",
                       replay="off")
    kept = copy.deepcopy(original)
    again = rejudge(original)
    _same(again, original)
    assert again.first_divergence.name == "Functional.conv2d.1.forward"
    assert NOTE in again.notes and again.verdict == ""
    _same(original, kept)                        # the result it was given is left alone
    assert original.notes == kept.notes


def test_looser_thresholds_clear_the_culprit_and_stricter_ones_find_one(runs):
    fault = compare(runs / "fault" / "step0" / "rank0", runs / "golden" / "step0" / "rank0",
                    replay="off")
    loose = rejudge(fault, {"tolerance": {"fp32": 0.1}, "scale_tolerance": {"fp32": 0.1}})
    assert loose.first_divergence is None and loose.counts["error"] == 0
    healthy = compare(runs / "bf16" / "step0" / "rank0", runs / "golden" / "step0" / "rank0",
                      replay="off")
    assert healthy.first_divergence is None
    strict = rejudge(healthy, {"tolerance": {"bf16": 1e-5, "fp32": 1e-7},
                               "scale_tolerance": {"bf16": 1e-7, "fp32": 1e-9}})
    assert strict.first_divergence is not None and strict.counts["error"] > 0


def test_several_pairs_are_judged_pair_by_pair(runs):
    original = compare(runs / "bf16", runs / "golden", replay="off")
    assert original.pairs and original.first_divergence.name == "Functional.linear.0.forward"
    again = rejudge(original)
    _same(again, original)
    assert again.first_divergence.step == 1
    assert [p["first_divergence"] for p in again.pairs] == \
        [p["first_divergence"] for p in original.pairs]


def test_a_result_loaded_from_summary_json_rejudges_like_the_one_in_memory(runs, tmp_path):
    original = compare(runs / "bf16", runs / "golden", tmp_path / "out", replay="off")
    loaded = load_summary(original.files["summary"])
    _same(rejudge(loaded), rejudge(original))
    _same(rejudge(loaded, {"bf16": 0.5}), rejudge(original, {"bf16": 0.5}))


# Notes whose words are those of replay's and the statistics' notes, but which say something else.
_LOOKALIKES = [Note("mapping pairs.yaml line 4: 'statistics only' never matched a module", Note.PAIRING),
               Note("step 1 rank 0: replayed tensors/ was unreadable in part", Note.DUMPS)]
_STALE = [Note("replayed 2 op(s) in float64 in 0.10 s", Note.REPLAY),
          Note("step 0 rank 0: statistics only: an op is named only when ...", Note.THRESHOLDS),
          Note(NOTE, Note.REJUDGED)]


def test_rejudge_drops_notes_by_their_kind_never_by_their_words(runs, tmp_path):
    original = compare(runs / "fault" / "step0" / "rank0", runs / "golden" / "step0" / "rank0",
                       replay="off")
    original.notes = [*_LOOKALIKES, *original.notes, *_STALE]
    again = rejudge(original)
    assert [n for n in again.notes if n in _LOOKALIKES] == _LOOKALIKES
    assert [note_kind(n) for n in again.notes if n in _LOOKALIKES] == [Note.PAIRING, Note.DUMPS]
    assert not [n for n in again.notes if n in _STALE[:2]], again.notes
    assert again.notes.count(NOTE) == 1         # said once, however often it was re-judged
    # summary.json keeps each note's kind ("note_kinds"), and the loaded result re-judges alike
    write_outputs(original, tmp_path / "out")
    loaded = load_summary(tmp_path / "out")
    assert [note_kind(n) for n in loaded.notes] == [note_kind(n) for n in original.notes]
    assert rejudge(loaded).notes == again.notes


def test_a_summary_json_without_note_kinds_is_read_with_the_kinds_its_words_had(runs, tmp_path):
    """summary.json of an opdiff before note kinds: the reader recognises the notes it wrote
    that re-judging drops; every other note is of kind OTHER."""
    import json

    original = compare(runs / "fault" / "step0" / "rank0", runs / "golden" / "step0" / "rank0",
                       replay="off")
    original.notes = ["the target's disk filled at record 3", *map(str, _STALE)]
    summary = write_outputs(original, tmp_path / "out")["summary"]
    data = json.loads(open(summary, encoding="utf-8").read())
    assert data["note_kinds"] == [Note.OTHER] * 4
    del data["note_kinds"]
    with open(summary, "w", encoding="utf-8") as f:
        json.dump(data, f)
    loaded = load_summary(summary)
    assert [note_kind(n) for n in loaded.notes] == [Note.OTHER] + [n.kind for n in _STALE]
    assert rejudge(loaded).notes == ["the target's disk filled at record 3", NOTE]


def _row(name, role, error, **kw):
    return TensorRow(target_name=f"{name}.{role}.0", golden_name=f"{name}.{role}.0",
                     op_name=name, role=role, phase="forward", kind="api", index=0,
                     target_dtype="float32", golden_dtype="float32", target_shape=(100,),
                     golden_shape=(100,), metrics={"Cosine": 1.0}, error=error, scale_error=0.0,
                     **kw)


@pytest.mark.parametrize("numbers, limits, kind", [
    ((), (), LOCAL),
    (("input.1: 2 vs 1",), (), NUMBER),
    ((), ("input.2: -65504 vs -3.4028235e+38",), None),   # dtype limits: as intended
])
def test_number_arguments_are_judged_again_from_the_rows(numbers, limits, kind):
    rows = [_row("Tensor.masked_fill.0.forward", "input", 0.0, differing_numbers=numbers,
                 dtype_limits=limits),
            _row("Tensor.masked_fill.0.forward", "output", 1.0, differing_numbers=numbers,
                 dtype_limits=limits)]
    result = CompareResult("t", "g", rows, None, {})
    fd = rejudge(result).first_divergence
    assert (fd and fd.kind) == kind


def test_rows_never_measured_keep_their_verdicts():
    unread = TensorRow(target_name="a", golden_name="a", op_name="Torch.empty.0.forward",
                       role="output", phase="forward", kind="api", index=0, result="pass",
                       reason="uninitialised memory (torch.empty): not compared")
    assert measurement(unread) is None
    again = rejudge(CompareResult("t", "g", [unread], None, {}))
    assert again.rows == [unread]


class _Attention(nn.Module):
    """Attention with biases on q, k and v: the key bias's gradient is mathematically 0
    (softmax is shift-invariant), so in bf16 it is rounding noise around a true zero."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.heads, self.norm = heads, nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = F.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return self.norm(x + self.o((a @ v).transpose(1, 2).reshape(b, t, d)))


def _attention_run(path, task, bf16):
    torch.manual_seed(0)
    model = nn.Sequential(_Attention(), _Attention(), nn.Linear(32, 8))
    x = torch.randn(2, 8, 32)
    with opdiff.dump(model, str(path), level="mix", task=task):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        out.float().pow(2).mean().backward()
    return path


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_rejudged_bf16_attention_with_key_bias_names_no_culprit_like_a_fresh_compare(
        tmp_path, task):
    """rejudge applies the noise-around-zero rule (`Policy.within_input_noise`) as the compare
    did: from rows.jsonl, whose rows carry no norm, it takes the scale from the statistics."""
    target = _attention_run(tmp_path / "bf16", task, bf16=True)
    golden = _attention_run(tmp_path / "fp32", task, bf16=False)
    fresh = compare(target, golden, tmp_path / "out", replay="off")
    assert fresh.first_divergence is None, fresh.verdict
    loaded = load_summary(fresh.files["summary"])
    again = rejudge(loaded)
    _same(again, fresh)
    assert again.first_divergence is None and again.counts["error"] == 0
    # the rule is what clears it: without the grad-outputs' scale the key bias's gradient is
    # far beyond bf16's tolerance relative to its own size
    bias_grads = [r for r in again.rows if r.kind == "param_grad" and r.error is not None
                  and r.error > 0.1]
    assert bias_grads, "expected a gradient that is noise around a true zero"


def _origin_run(path, spoil=False, reseed=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    if spoil:
        with torch.no_grad():
            model[3].weight[1, 2] += 1e-2
    if reseed:
        torch.manual_seed(99)
    with opdiff.dump(model, str(path), level="mix", task="tensor"):
        model(x).pow(2).mean().backward()
    return path


@pytest.mark.parametrize("case", ["parameter", "random"])
def test_a_rejudged_origin_keeps_its_origin_tensor_and_reader(tmp_path, case):
    golden = _origin_run(tmp_path / "golden")
    target = _origin_run(tmp_path / "target", spoil=case == "parameter",
                         reseed=case == "random")
    fresh = compare(target, golden, tmp_path / "out", replay="off")
    assert fresh.first_divergence.origin == case
    again = rejudge(load_summary(fresh.files["summary"])).first_divergence
    fd = fresh.first_divergence
    assert (again.origin, again.name, again.tensor) == (fd.origin, fd.name, fd.tensor)


def test_the_op_facts_scores_are_made_of_load_back_from_rows_jsonl(runs, tmp_path):
    """`scores.op_score` makes an op's score from the facts its rows carry, in the compare and
    in rejudge: rows.jsonl must give every one of them back as the compare had them."""
    from opdiff.comparison.scores import OP_FACTS, op_facts

    original = compare(runs / "bf16", runs / "golden", tmp_path / "out", replay="off")
    loaded = load_summary(original.files["summary"])
    assert [op_facts(r) for r in loaded.rows] == [op_facts(r) for r in original.rows]
    assert {"differing_numbers", "leaf_tensor", "rng", "stack"} <= set(OP_FACTS)
