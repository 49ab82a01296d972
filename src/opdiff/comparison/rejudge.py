"""A compare judged again with other thresholds, from the metrics its rows carry: no dump is read.

    from opdiff.comparison import rejudge
    from opdiff.report.summary import load_summary
    again = rejudge(load_summary("out/summary.json"), {"tolerance": {"bf16": 0.03}})
    again.first_divergence, again.counts

Every measured row gets its verdict from the new `Policy`, then each step/rank pair is judged
again by the compare's own judgement (`judgement.judge_pair`), with what the compare's plan
decided (`facts.PairFacts`, saved in summary.json; from the rows' marks in older files).

What it cannot redo, because it needs the dumps:
- replay: the float64 re-runs are not repeated, so a culprit only replay had found
  (`Divergence.kind == "replay"`) is not found again, and one replay had cleared may come back;
  compare again with the dumps for that;
- rows that were never measured keep their verdicts: unmatched tensors, shapes that differ,
  empty or unread tensors, tensors with neither values nor statistics saved;
- an inf/NaN mismatch is recognised from its infinite error; its row says "inf/NaN positions
  differ" instead of how many;
- rows.jsonl written before the rows carried `leaf`, `leaf_tensor`, `reader`, `leaf_strict`,
  `rng` and `leaf_input` (what the origin rules read): there a leaf origin is found again only
  as the leaf record itself, and a random op as its own error;
- results written before a region's facts held what its verdict says of its boundary
  (`region_facts.py`: how its ops read its inputs, the tensors it made, its module call): there
  a region's inputs are named as they were measured;
- the noise-around-zero rule takes its scale from the statistics' norms (a compare measures it
  from the tensors: the same number in the dump's precision).

The result's `verdict` is left empty and `files` empty: the presenter writes them
(`opdiff.report.console.verdict_line`, `opdiff.report.write_outputs`).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Optional

from ..store.schema import RecordName
from . import forced
from .blame import OpScore
from .facts import for_pair
from .judgement import judge_pair
from .metric_table import Measurement
from .reasons import statistics_limits, with_context
from .region_facts import units_of
from .result import UNMATCHED, CompareResult, Divergence, Note, TensorRow, count, note_kind, noted
from .runs import merge
from .scores import Entry, add_row, op_facts, op_score
from .verdicts import Policy, Thresholds

NOTE = "re-judged from the saved metrics with other thresholds (replay not redone)"
# The kinds of notes a re-judged result drops: made again from the new thresholds, no longer
# true (replay is not redone), or said once more (NOTE).
STALE = (Note.THRESHOLDS, Note.REPLAY, Note.REJUDGED)


def rejudge(result: CompareResult, thresholds: Thresholds | dict[str, Any] | str | None = None, *,
            policy: Optional[Policy] = None) -> CompareResult:
    """A new CompareResult: `result`'s rows judged by `thresholds` (anything `Thresholds.load`
    takes) or by `policy`, and the first divergence found again. `result` is left as it is."""
    policy = policy or Policy(thresholds)
    notes = [n for n in result.notes if note_kind(n) not in STALE] + [Note(NOTE, Note.REJUDGED)]
    groups: dict[tuple[Optional[int], Optional[int]], list[TensorRow]] = {}
    for row in result.rows:
        groups.setdefault((row.step, row.rank), []).append(row)
    if not result.pairs:                        # one step/rank pair
        again = _pair(result, result.rows, policy, result.step, result.rank)
        again.notes = notes + again.notes
        return again
    pairs = [_pair(result, rows, policy, step, rank) for (step, rank), rows in groups.items()]
    merged = merge(result.target, result.golden, pairs, notes)
    merged.environment_diff, merged.title = list(result.environment_diff), result.title
    return merged


def _pair(result: CompareResult, rows: list[TensorRow], policy: Policy, step: Optional[int],
          rank: Optional[int]) -> CompareResult:
    rows = list(rows)
    facts = for_pair(result.facts, rows, step, rank)    # what the compare's plan decided
    unjudged = facts.unjudged_rows()
    scores: dict[str, OpScore] = {}
    entries: dict[int, Entry] = {}
    for i, row in enumerate(rows):
        score = scores.get(row.op_name)
        if score is None:
            parsed = RecordName.parse(row.op_name)
            score = scores[row.op_name] = op_score(op_facts(row), paired=row.result != UNMATCHED,
                                                   op=parsed.op if parsed else row.op_name)
        m = measurement(row)
        if m is None:
            continue
        rows[i] = row = _judged(row, m, policy)
        if row.target_name in unjudged:     # a forced pair's output not judged on its own
            rows[i] = forced.not_judged(row)
            continue
        entries[i] = add_row(score, i, row, m)
    measured = {rows[i].target_name: entry for i, entry in entries.items()}
    forced.carry(facts, scores, measured)   # measured where the target made them
    region_ops, region_rows = units_of(facts.regions, rows, entries)
    divergence, _held = judge_pair(list(scores.values()) + region_ops, rows, facts, policy,
                                   regions=(region_ops, region_rows, None))
    if divergence is not None:
        divergence = _with_context(result, replace(divergence, step=step, rank=rank))
    limits = statistics_limits(rows, policy)
    return CompareResult(target=result.target, golden=result.golden, rows=rows,
                         first_divergence=divergence, counts=count(rows),
                         environment_diff=list(result.environment_diff), step=step, rank=rank,
                         title=result.title, notes=[*noted(limits, Note.THRESHOLDS)],
                         facts=[facts] if facts else [])


def _with_context(result: CompareResult, divergence: Divergence) -> Divergence:
    """The source lines around the divergence's line: those `result` showed for the same line,
    else those its dump holds (`reasons.source_context`; no file a dump names is read)."""
    if divergence.context or divergence.location is None:
        return divergence
    for old in [result.first_divergence, *(p.get("first_divergence") for p in result.pairs)]:
        if old is not None and old.location == divergence.location and old.context:
            return replace(divergence, context=old.context)
    sides = [(p.get("target"), p.get("golden")) for p in result.pairs
             if (p.get("step"), p.get("rank")) == (divergence.step, divergence.rank)]
    return with_context(divergence, dumps=sides[0] if sides else (result.target, result.golden))


def measurement(row: TensorRow) -> Optional[Measurement]:
    """The Measurement a measured row was judged from, rebuilt from its fields; None for a row
    that was never measured (see the module docstring)."""
    if row.result == UNMATCHED or row.error is None or not row.metrics:
        return None
    numel = 1
    for n in row.target_shape or ():
        numel *= int(n)
    mismatch = 1 if math.isinf(row.error) else 0
    return Measurement(dict(row.metrics), error=row.error, scale_error=row.scale_error or 0.0,
                       numel=numel, mode=row.mode, nonfinite_mismatch=mismatch,
                       message="inf/NaN positions differ" if mismatch else "",
                       norm=_norm(row) if row.error or row.mode == "statistics" else 0.0)


def _norm(row: TensorRow) -> float:
    """max(|t|, |g|) (L2), the scale the noise-around-zero rule measures a difference against
    (`Policy.within_input_noise`), from the statistics both sides recorded: a compare measures
    it from the tensors, rows.jsonl keeps only the statistics, which hold the same norm (in the
    dump's precision). 0 (no scale: the rule does not apply) where neither side recorded one or
    it is not finite, as in `stats_measure`, and for bitwise-equal tensors, whose norm a compare
    of tensors does not measure either."""
    norms = [row.target_stats.get("norm"), row.golden_stats.get("norm")]
    norm = max(float(n) if isinstance(n, (int, float)) else 0.0 for n in norms)
    return norm if math.isfinite(norm) else 0.0


def _judged(row: TensorRow, m: Measurement, policy: Policy) -> TensorRow:
    verdict = policy.judge(m, row.target_dtype, row.golden_dtype)
    return replace(row, result=verdict.result, accuracy_reached=verdict.accuracy_reached,
                   reason=verdict.reason)


__all__ = ["rejudge", "measurement", "NOTE", "STALE"]
