"""A sequence alone against the same sequence as a row of a padded batch (right or left padded,
attention mask given; tiny HF Llama, fp32, tensor dumps, level mix): the healthy pair names
nothing and says which rows and positions it matched; layer 1's MLP activation 1% wrong is named
at that op, with the token positions where it differs. Before comparison/tokens the healthy pairs
were "inconclusive" with shape errors, and the faults were missed."""
from __future__ import annotations

import pytest

import opdiff
from opdiff.comparison.result import Note, note_kind

# (target layout, golden layout, golden row = target row, the positions matched)
LAYOUTS = [("right", "alone", "golden row 0 positions 0-11 = target row 0 positions 0-11"),
           ("left", "alone", "golden row 0 positions 0-11 = target row 1 positions 0-11"),
           ("right_short", "short", "golden row 0 positions 0-8 = target row 0 positions 0-8")]


def _notes(result, kind):
    return [str(n) for n in result.notes if note_kind(n) == kind]


@pytest.mark.parametrize("target,golden,matched", LAYOUTS)
def test_healthy_padded_batch_names_nothing(token_dump, target, golden, matched):
    result = opdiff.compare(token_dump(target), token_dump(golden), progress=False)
    assert result.first_divergence is None
    assert result.counts["error"] == 0 and result.counts["warning"] == 0
    assert not _notes(result, Note.INCONCLUSIVE)
    said = " ".join(_notes(result, Note.PAIRING))
    assert matched in said and "same ids" in said
    # the other row is named as not compared, never counted
    assert "no partner on the other side: target row" in said
    # every compared activation holds the matched sequence's tokens only
    embedded = next(r for r in result.rows if r.target_name == "Functional.embedding.0.forward"
                    ".output.0")
    assert embedded.target_shape == embedded.golden_shape == (1, 9 if golden == "short" else 12, 32)


@pytest.mark.parametrize("target,golden,matched", LAYOUTS)
def test_mlp_fault_in_padded_row_named_with_its_tokens(token_dump, target, golden, matched):
    result = opdiff.compare(token_dump(target, fault="Functional.silu:1"), token_dump(golden),
                            progress=False)
    found = result.first_divergence
    assert found is not None and found.name == "Functional.silu.1.forward"
    assert "layers.1.mlp" in (found.module or "")
    where = next(n for n in _notes(result, Note.PAIRING) if "differs on its tokens" in n)
    length = 9 if golden == "short" else 12
    assert f"Functional.silu.1.forward differs on its tokens: sequence 0: at every one of its " \
           f"{length} real tokens" in where
    row = matched.split(" = ")[1].split(" positions")[0]        # "target row 1"
    assert row in where


def test_two_sequences_in_another_order_and_padding(token_dump):
    # golden [SEQ; OTHER + pads], target [OTHER + pads; SEQ]: both pairs of rows compared
    healthy = opdiff.compare(token_dump("right_short"), token_dump("right"), progress=False)
    assert healthy.first_divergence is None
    assert healthy.counts["error"] == healthy.counts["warning"] == healthy.counts["unmatched"] == 0
    said = " ".join(_notes(healthy, Note.PAIRING))
    assert "golden row 0 positions 0-11 = target row 1 positions 0-11" in said
    assert "golden row 1 positions 0-8 = target row 0 positions 0-8" in said
    faulty = opdiff.compare(token_dump("right_short", fault="Functional.silu:1"),
                            token_dump("right"), progress=False)
    assert faulty.first_divergence is not None
    assert faulty.first_divergence.name == "Functional.silu.1.forward"
    where = next(n for n in _notes(faulty, Note.PAIRING) if "differs on its tokens" in n)
    assert "sequence 1: at every one of its 9 real tokens" in where and "target row 0" in where
