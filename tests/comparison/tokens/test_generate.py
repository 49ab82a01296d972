"""Greedy `model.generate` (a prefill of 8 tokens, then 3 decode steps through the KV cache,
with generate's own ops between them) against one forward over the generated sequence, as a
trainer scores a rollout (tiny HF Llama, fp32, tensor dumps, level mix). Healthy: nothing named,
no error or warning row, nothing inconclusive; what is left unmatched is generate's own work
(stopping criteria, argmax, the position ids it passes) and the position ids the one forward
makes itself, never a layer's op. A 1% fault on the decode path is named at its op, in its
layer and decode step, at the token that step computed. Before this, the cache positions
`generate` passes shifted every op after them: the healthy pair had 14 error rows and blamed
`Torch.arange.5`, and faults in later steps were blamed on the KV cache's region."""
from __future__ import annotations

import pytest

import opdiff
from opdiff.comparison.result import Note, note_kind


def _notes(result, kind):
    return [str(n) for n in result.notes if note_kind(n) == kind]


def test_healthy_generate_against_one_forward_names_nothing(token_dump):
    result = opdiff.compare(token_dump("generate"), token_dump("generated"), progress=False)
    assert result.first_divergence is None
    assert result.counts["error"] == result.counts["warning"] == 0
    assert not _notes(result, Note.INCONCLUSIVE)
    assert "the target ran 4 forward passes through its KV cache (8 + 1 + 1 + 1 tokens)" in \
        " ".join(_notes(result, Note.PAIRING))
    left = [r for r in result.rows if r.result == "unmatched"]
    assert left and not any(".layers." in (r.module or "") for r in left)
    # each decode step's attention compared: its query holds one token, its keys all so far
    scores = {r.target_shape for r in result.rows if r.golden_name and r.role == "output"
              and (r.target_name or "").startswith("Functional.softmax.")}
    assert {(1, 4, 1, 9), (1, 4, 1, 10), (1, 4, 1, 11)} <= scores


# (silu and softmax calls 2k, 2k+1 are decode pass k's layers 0 and 1; linear: 7 per layer
# and 1 lm_head, 15 per pass, o_proj of layer 1 the 10th of pass 2)
@pytest.mark.parametrize("fault,module,position", [
    ("Functional.silu:3", "layers.1.mlp.act_fn.SiLUActivation.forward.1", 8),
    ("Functional.softmax:4", "layers.0.self_attn.LlamaAttention.forward.2", 9),
    ("Functional.linear:40", "layers.1.self_attn.o_proj.Linear.forward.2", 9)])
def test_fault_in_a_decode_step_named_at_its_op_and_token(token_dump, fault, module, position):
    result = opdiff.compare(token_dump("generate", fault=fault), token_dump("generated"),
                            progress=False)
    found = result.first_divergence
    op, call = fault.split(":")
    assert found is not None and found.name == f"{op}.{call}.forward"
    assert (found.module or "").endswith(module)
    where = next(n for n in _notes(result, Note.PAIRING) if "differs on its tokens" in n)
    assert f"at its one real token (first at position {position})" in where
