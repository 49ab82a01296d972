"""bf16 against emulated FP8 on a 2-layer tiny Llama, one training step (fp8kit.py): the compare
names nothing while each quantize op stays within its format and scale; a planted wrong scale is
named at its quantize op (2x too large, or an amax taken on a local piece); the GEMM ranking
puts a planted outlier layer first, measured in an FP8 run and replayed from a bf16 run."""
from __future__ import annotations

import pytest

import opdiff
from opdiff.comparison.result import Note, note_kind
from opdiff.lowp import judge_run, rank_gemms
from opdiff.report.console import verdict_kind
from opdiff.store.adapters import discover

from fp8kit import OUTLIER_LAYER

UP = "model.layers.1.mlp.up_proj"
Q = "model.layers.0.self_attn.q_proj"


def _one(path):
    return discover(path)[0]


def _compare(fp8_dump, tmp_path, plant=None):
    return opdiff.compare(fp8_dump("fp8", plant), fp8_dump("bf16"), output_path=tmp_path / "out",
                          progress=False)


@pytest.mark.slow
def test_healthy_fp8_names_nothing(fp8_dump, tmp_path):
    result = _compare(fp8_dump, tmp_path)
    assert result.first_divergence is None
    assert not [n for n in result.notes if note_kind(n) == Note.INCONCLUSIVE]
    assert any("28 quantize op(s) of the target" in n and "within" in n for n in result.notes)
    assert verdict_kind(result) in ("explained", "agree")


@pytest.mark.slow
@pytest.mark.parametrize("plant, module", [("wrong:" + UP, UP), ("local:" + Q, Q)])
def test_wrong_scale_named_at_its_quantize_op(fp8_dump, tmp_path, plant, module):
    dump = _one(fp8_dump("fp8", plant))
    verdicts = judge_run(dump)
    wrong = [v for v in verdicts if not v.within]
    assert len(verdicts) == 28 and len(wrong) == 1
    assert f"Module.{module}.FP8Linear" in (wrong[0].module or "")
    assert wrong[0].clipped == wrong[0].outside > 0
    cast = next(r for r in dump.records() if r["name"] == wrong[0].record)
    assert cast["outputs"][0]["dtype"] == "float8_e4m3fn"     # the cast into e4m3 is named

    result = _compare(fp8_dump, tmp_path, plant)
    said = [n for n in result.notes if note_kind(n) == Note.INCONCLUSIVE]
    assert len(said) == 1 and wrong[0].record in said[0] and module in said[0]
    assert "clipped" in said[0]
    # never "agree" past a wrong scale; where blame names a culprit too, it is in that Linear
    # (the quantize ops there, judged as one region against golden's none)
    assert verdict_kind(result) in ("inconclusive", "divergence")
    found = result.first_divergence
    assert found is None or module in (found.module or "")


@pytest.mark.slow
def test_a_fault_beside_fp8_is_still_named(fp8_dump, tmp_path):
    """The FP8 run's own rounding does not hide a 5% fault in an op it does not quantize."""
    result = _compare(fp8_dump, tmp_path, "fault:Functional.silu:1")
    found = result.first_divergence
    assert found is not None and found.name == "Functional.silu.1.forward"
    assert "model.layers.1.mlp.act_fn" in (found.module or "")


def test_ranking_puts_the_outlier_layer_first(fp8_dump):
    for precision, how in (("fp8", "measured"), ("bf16", "what-if")):
        dump = _one(fp8_dump(precision, "outlier"))
        ranked = rank_gemms(list(dump.records()), dump.tensor)
        assert len(ranked) >= 14 and all(g.how.startswith(how) for g in ranked)
        top = [g.module or "" for g in ranked[:2]]
        assert all(f"{OUTLIER_LAYER}.mlp." in m for m in top), (precision, top)
        assert ranked[1].error > 3 * ranked[2].error
        if precision == "fp8":      # the outlier is what the format explains: nothing is wrong
            assert all(v.within for v in judge_run(dump))


def test_without_the_outlier_no_layer_stands_out(fp8_dump):
    dump = _one(fp8_dump("bf16"))
    ranked = rank_gemms(list(dump.records()), dump.tensor)
    assert ranked[0].error < 1.5 * ranked[-1].error


@pytest.mark.slow
def test_dequantized_by_twice_the_scale_named(fp8_dump, tmp_path):
    """The quantize op is right but the GEMM reads its output divided by twice its scale: the
    compare alone named nothing for this (the GEMM's input halved, judged at float8's
    tolerance); the quantize op is named with the GEMM that reads it."""
    dump = _one(fp8_dump("fp8", "dequant:" + UP))
    wrong = [v for v in judge_run(dump) if not v.within]
    assert len(wrong) == 1 and f"Module.{UP}.FP8Linear" in (wrong[0].module or "")
    assert wrong[0].outside == 0 and "0.5x" in wrong[0].dequantized
    result = _compare(fp8_dump, tmp_path, "dequant:" + UP)
    said = [n for n in result.notes if note_kind(n) == Note.INCONCLUSIVE]
    assert len(said) == 1 and wrong[0].record in said[0] and "another scale" in said[0]
    found = result.first_divergence
    assert found is None or UP in (found.module or "")
