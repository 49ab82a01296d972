"""One judgement of one step/rank pair, the same for a compare and for `rejudge`.

    divergence, held = judge_pair(units, rows, facts, policy, regions=(region_ops, region_rows))

A compare measures its rows, makes its units (ops, module calls, regions: `blame.OpScore`) and
its `facts.PairFacts` from the plan it ran; `rejudge` rebuilds the same from summary.json and
rows.jsonl. Both hand them here: what blame may not name (`not_named`), the first divergence
(`blame.analyse`), and each region's rows worded by its verdict (`regions.mark_region_rows`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .blame import OpScore, analyse
from .compiled_backward import WITHHELD
from .compiled_inputs import late
from .facts import PairFacts
from .regions import mark_region_rows
from .result import Divergence, TensorRow
from .verdicts import Policy

if TYPE_CHECKING:
    from .replay import Replayer

# a pair's regions as judged units: (their scores, region number -> its rows,
# region number -> why it was not judged (None: rejudge, whose rows say it already))
Regions = tuple[list[OpScore], dict[int, list[int]], Optional[dict[int, str]]]


def not_named(rows: list[TensorRow], facts: PairFacts) -> dict[str, str]:
    """Record name -> why blame must not name it: the `withheld` records, and the `exposed`
    calls whose input already differs in statistics (`compiled_inputs.late`)."""
    return {**dict.fromkeys(facts.withheld, WITHHELD), **late(rows, set(facts.exposed))}


def judge_pair(units: list[OpScore], rows: list[TensorRow], facts: PairFacts, policy: Policy, *,
               regions: Optional[Regions] = None, replay: Optional[Replayer] = None,
               replay_all: bool = False) -> tuple[Optional[Divergence], dict[str, str]]:
    """(the first divergence or None, what blame did not name and why); `rows` are rewritten
    in place with the blame's and the regions' words."""
    held = not_named(rows, facts)
    divergence = analyse(units, rows, policy, replay=replay, replay_all=replay_all,
                         withheld=held)
    if regions is not None:
        region_ops, region_rows, unjudged = regions
        mark_region_rows(rows, region_ops, region_rows, unjudged)
    return divergence, held


__all__ = ["judge_pair", "not_named", "Regions"]
