"""The evidence chain of a compare: its verdict as typed facts an agent (or a person) can act on.

A finished compare already holds the reasoning behind its verdict, spread over the first
divergence, the rows and the notes. This package gathers it into one object, written into
summary.json as `evidence` (schema: `opdiff/schemas/compare-summary.schema.json`, `$defs/evidence`):

    from opdiff.explain import evidence_of
    chain = evidence_of(result)          # a CompareResult, fresh or loaded back
    chain["verdict"], chain["confidence"]          # "culprit", "confirmed"
    [f["type"] for f in chain["facts"]]           # ["culprit", "inputs_agree", "output_differs", ...]
    chain["next"]["action"], chain["next"]["config"]   # what to do next; the capture that settles it

- `chain`: the verdict, the culprit, the facts and the confidence, from the result alone;
- `next_step`: the next capture (an msprobe-style config for `opdiff run --config` or
  `PrecisionDebugger(config_path=...)`) or the next thing to read;
- `query`: a small expression language over rows (`opdiff query OUT 'EXPR'`), no eval;
- `console`: the chain printed short for a person (`opdiff explain OUT`);
- `SKILL.md`: the skill file for coding agents (`opdiff skill`).

Nothing here judges a tensor again: the verdicts are the compare's; the chain only says which of
them the verdict rests on, and what would settle what is left.
"""
from __future__ import annotations

from .chain import CONFIDENCES, FACT_TYPES, VERDICTS, evidence_of

__all__ = ["evidence_of", "VERDICTS", "CONFIDENCES", "FACT_TYPES"]
