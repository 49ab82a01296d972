"""Two greedy `generate` runs of a tiny HF Llama (fp32, tensor dumps, level mix) whose tokens
part after the prompt: opdiff says whether the first differing token is a tie (golden's logit
margin between the two candidates within the error the runs' logits show before that step, or
the dtype's rounding) or a real split, and the op-level compare goes on as before.

(a) lm_head's rows of tokens 16 and 32 made equal up to 1e-6 in golden (row 16 = row 32 x
(1 + 1e-6)), and the target perturbed by 1e-5 (x (1 - 1e-5)): at the step choosing position 9
the two logits are nearly tied (golden's margin 2e-7, within 4x the 4e-7 its logits already
differ by a position before), and the runs choose differently. (b) a 5% fault in pass 1's layer-1 softmax flips that
token (32 -> 16, golden's margin 1.8e-3): a real split, the fault still named at its op.
Before this, no note said either."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import pytest
import torch

import opdiff
from opdiff.comparison.result import Note, note_kind
from opdiff.testing import inject_fault
from tokenkit import PROMPT, llama


def _generate(path: Path, scale: Optional[float] = None, fault: Optional[str] = None) -> Path:
    model = llama()
    if scale is not None:      # a near tie between tokens 16 and 32 at the step choosing 9
        with torch.no_grad():
            model.lm_head.weight[16] = model.lm_head.weight[32] * scale
    planted = inject_fault(op=fault.split(":")[0], call=int(fault.split(":")[1]), scale=1.05) \
        if fault else nullcontext()
    with planted, torch.no_grad():
        with opdiff.dump(model, str(path), level="mix", task="tensor"):
            model.generate(PROMPT[None], max_new_tokens=4, do_sample=False, pad_token_id=0)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ties")
    return {"healthy": _generate(root / "healthy"),
            "faulty": _generate(root / "faulty", fault="Functional.softmax:3"),
            "tie_golden": _generate(root / "tie_golden", scale=1 + 1e-6),
            "tie_target": _generate(root / "tie_target", scale=1 - 1e-5)}


def _split(result) -> list[str]:
    return [str(n) for n in result.notes if note_kind(n) == Note.PAIRING
            and "generated tokens part" in n]


def test_near_tied_logits_are_called_a_tie(runs):
    result = opdiff.compare(runs["tie_target"], runs["tie_golden"], progress=False)
    said = _split(result)
    assert len(said) == 1, result.notes
    assert "part at position 9 (target chose 32, golden 16)" in said[0]
    assert "a tie, either choice is right" in said[0] and "real split" not in said[0]


def test_fault_that_flips_a_token_is_a_real_split_named_at_its_op(runs):
    result = opdiff.compare(runs["faulty"], runs["healthy"], progress=False)
    said = _split(result)
    assert len(said) == 1, result.notes
    assert "part at position 9 (target chose 16, golden 32)" in said[0]
    assert "a real split, look at the op-level compare up to position 9" in said[0]
    found = result.first_divergence
    assert found is not None and found.name == "Functional.softmax.3.forward"


def test_same_generated_tokens_say_nothing_of_a_split(runs):
    result = opdiff.compare(runs["healthy"], runs["healthy"], progress=False)
    assert not _split(result) and result.first_divergence is None
