"""A prefill of 11 tokens plus one decode step through the KV cache against one forward of the
12 (tiny HF Llama, fp32, tensor dumps, level mix): the healthy pair names nothing and leaves
nothing unmatched (the cache's concatenation is a region, judged through its boundary); a 1%
fault in the decode step's MLP or attention is named at its op, in its layer, at token 11.
Before comparison/tokens the decode step was left unmatched and the faults were missed ("no
divergence")."""
from __future__ import annotations

import pytest

import opdiff
from opdiff.comparison.result import Note, note_kind


def _notes(result, kind):
    return [str(n) for n in result.notes if note_kind(n) == kind]


def test_healthy_decode_against_one_forward_names_nothing(token_dump):
    result = opdiff.compare(token_dump("decode"), token_dump("alone"), progress=False)
    assert result.first_divergence is None
    assert result.counts["error"] == result.counts["warning"] == result.counts["unmatched"] == 0
    assert not _notes(result, Note.INCONCLUSIVE)
    said = " ".join(_notes(result, Note.PAIRING))
    assert "the target ran 2 forward passes through its KV cache (11 + 1 tokens)" in said
    # the decode step's own rows are compared: its query holds token 11, its keys all 12
    scores = [r for r in result.rows if r.target_name and r.target_name.startswith(
        "Torch.matmul.") and r.role == "output" and r.golden_name]
    assert (1, 4, 1, 12) in {r.target_shape for r in scores} and \
        all(r.target_shape == r.golden_shape for r in scores)


def test_one_forward_against_a_decoding_golden_names_nothing(token_dump):
    result = opdiff.compare(token_dump("alone"), token_dump("decode"), progress=False)
    assert result.first_divergence is None
    assert result.counts["error"] == result.counts["unmatched"] == 0
    assert "the golden ran 2 forward passes" in " ".join(_notes(result, Note.PAIRING))


# (silu and softmax calls 0, 1 are the prefill's layers 0, 1; 2, 3 the decode step's)
@pytest.mark.parametrize("fault,layer", [("Functional.silu:3", "layers.1.mlp"),
                                         ("Functional.softmax:2", "layers.0.self_attn")])
def test_fault_on_the_decode_path_named_at_its_op_and_token(token_dump, fault, layer):
    result = opdiff.compare(token_dump("decode", fault=fault), token_dump("alone"),
                            progress=False)
    found = result.first_divergence
    op, call = fault.split(":")
    assert found is not None and found.name == f"{op}.{call}.forward"
    assert layer in (found.module or "") and found.module.endswith(".forward.1")
    where = next(n for n in _notes(result, Note.PAIRING) if "differs on its tokens" in n)
    assert "at its one real token (first at position 11)" in where
