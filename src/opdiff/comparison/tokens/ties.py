"""Where two runs' generated tokens part: a tie or a real split.

Each side's tokens are its forward passes' ids put end to end (`sequences.passes`: a prefill and
each decode step of `generate`, or one forward over a whole sequence), one row only. At the
first position P where they differ (after a shared prefix), the token there was chosen from the
logits at position P-1, which both sides computed from the same tokens. The logits are found
generically: in each pass, the last saved [1, n, vocab] output (vocab: the embedding weight's
rows), e.g. lm_head's, holding the logits of the pass's last n tokens (`generate` keeps only
the last one's).

golden's margin M = |golden logit[target's token] - golden logit[golden's token]| at P-1 is a
tie when M <= noise, where

    noise = max(NOISE_FACTOR x the largest |target - golden| logit error at the positions < P-1
                                 where both sides kept logits,
                the dtype's eps x the largest |golden logit| at P-1)

(the error the runs' logits already show where they agreed on every token, and the rounding
of a logit of that size). Otherwise it is a real split, and the op-level compare of the shared
prefix names where the runs part. The noise is measured before the step, so a fault that moves
every logit as much as the margin reads as a tie of this precision; the op-level compare still
names it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...store.records import iter_tensors
from ...store.schema import Role, Record
from ...store.source import DumpSource
from ..result import Note
from .sequences import load_ids, passes

if TYPE_CHECKING:
    import torch

NOISE_FACTOR = 4.0


def _vocab(records: list[Record], at: int) -> Optional[int]:
    """Rows of the embedding weight of the call at `at` (its 2-D floating-point input)."""
    for _, role, desc in iter_tensors(records[at]):
        shape = list(desc.get("shape") or ())
        if role == Role.INPUT and len(shape) == 2 and "float" in str(desc.get("dtype") or ""):
            return int(shape[0])
    return None


def _side(dump: DumpSource, records: list[Record]
          ) -> Optional[tuple[list[int], dict[int, "torch.Tensor"]]]:
    """The side's tokens and its logits ([vocab]) by position, at the positions it kept them
    for (`generate` keeps only each pass's last); None where it has no single row of ids."""
    found = passes(records)
    if not found:
        return None
    vocab = _vocab(records, found[0][0])
    if vocab is None:
        return None
    tokens: list[int] = []
    logits: dict[int, "torch.Tensor"] = {}
    bounds = [i for i, _ in found] + [len(records)]
    for k, (_, desc) in enumerate(found):
        rows = load_ids(dump, desc)
        if rows is None or len(rows) != 1:
            return None
        tokens += rows[0]
        out = None      # the pass's last [1, n, vocab] output: its logits at its last n tokens
        for record in records[bounds[k]:bounds[k + 1]]:
            for _, role, d in iter_tensors(record):
                shape = list(d.get("shape") or ())
                if role == Role.OUTPUT and d.get("key") and len(shape) == 3 and \
                        shape[0] == 1 and shape[-1] == vocab and 0 < shape[1] <= len(rows[0]):
                    out = d
        tensor = dump.tensor(out["key"]) if out is not None else None
        if tensor is None:
            continue
        start = len(tokens) - int(tensor.shape[1])
        logits.update({start + q: row for q, row in enumerate(tensor[0].double())})
    return tokens, logits


def generated_split(target: DumpSource, golden: DumpSource, t_records: list[Record],
                    g_records: list[Record]) -> Optional[Note]:
    """The note on where the runs' generated tokens part (see the module docstring), or None
    where they do not part, or a side holds no ids or logits to tell."""
    import torch

    t_side, g_side = _side(target, t_records), _side(golden, g_records)
    if t_side is None or g_side is None:
        return None
    (t_tokens, t_logits), (g_tokens, g_logits) = t_side, g_side
    n = min(len(t_tokens), len(g_tokens))
    at = next((p for p in range(n) if t_tokens[p] != g_tokens[p]), None)
    if at is None or at < 2:
        return None         # the same tokens, or no shared prefix to tell from
    a, b = t_tokens[at], g_tokens[at]
    step = g_logits.get(at - 1)
    if step is None:
        return None
    margin = abs(float(step[b] - step[a]))
    errors = [float((t_logits[q] - g_logits[q]).abs().max()) for q in range(at - 1)
              if q in t_logits and q in g_logits]
    seen = max(errors, default=0.0)
    dtype = _dtype(g_records) or torch.float32
    rounding = torch.finfo(dtype).eps * float(step.abs().max())
    noise = max(NOISE_FACTOR * seen, rounding)
    head = (f"the runs' generated tokens part at position {at} (target chose {a}, golden {b}): "
            f"golden's logit margin between them is {margin:.3g}")
    if margin <= noise:
        return Note(f"{head}, within its measured noise (logit error {seen:.3g} at the "
                    f"positions before, rounding {rounding:.3g}): a tie, either choice is right",
                    Note.PAIRING)
    return Note(f"{head}, beyond its measured noise (logit error {seen:.3g} at the positions "
                f"before, rounding {rounding:.3g}): a real split, look at the op-level compare "
                f"up to position {at}", Note.PAIRING)


def _dtype(records: list[Record]) -> Optional["torch.dtype"]:
    import torch

    for record in reversed(records):
        for _, role, desc in iter_tensors(record):
            if role == Role.OUTPUT and str(desc.get("dtype") or "").replace("torch.", "") in \
                    ("float16", "bfloat16", "float32", "float64"):
                found: torch.dtype = getattr(torch, str(desc["dtype"]).replace("torch.", ""))
                return found
    return None


__all__ = ["generated_split", "NOISE_FACTOR"]
