"""An encoder (BERT) and an encoder-decoder (T5, its encoder's input padded, the decoder's input
the same per row) against the sequence alone: the healthy pair names nothing; a 1% fault in layer
1's MLP activation (BERT's GELU, T5's encoder ReLU) is named at that op, with its tokens. Nothing
in comparison/tokens knows either model: rows and positions come from the recorded shapes."""
from __future__ import annotations

import pytest

import opdiff
from opdiff.comparison.result import Note, note_kind

FAMILIES = [("bert", "right", "Functional.gelu:1", "encoder.layer.1.intermediate"),
            ("t5", "left", "Functional.relu:1", "encoder.block.1.layer.1")]


def _notes(result, kind):
    return [str(n) for n in result.notes if note_kind(n) == kind]


@pytest.mark.parametrize("family,layout,fault,module", FAMILIES)
def test_healthy_family_padded_names_nothing(token_dump, family, layout, fault, module):
    result = opdiff.compare(token_dump(layout, family=family), token_dump("alone", family=family),
                            progress=False)
    assert result.first_divergence is None
    assert result.counts["error"] == 0 and result.counts["warning"] == 0
    assert not _notes(result, Note.INCONCLUSIVE)
    assert "same ids" in " ".join(_notes(result, Note.PAIRING))


@pytest.mark.parametrize("family,layout,fault,module", FAMILIES)
def test_family_fault_named_with_its_tokens(token_dump, family, layout, fault, module):
    result = opdiff.compare(token_dump(layout, fault=fault, family=family),
                            token_dump("alone", family=family), progress=False)
    found = result.first_divergence
    op, call = fault.split(":")
    assert found is not None and found.name == f"{op}.{call}.forward"
    assert module in (found.module or "")
    assert any("differs on its tokens: sequence 0: at every one of its 12 real tokens" in n
               for n in _notes(result, Note.PAIRING))
