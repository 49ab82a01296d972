"""A result as an opdiff wrote it before summary.json held what a pair's plan decided
(`facts.PairFacts`): to check that such files still re-judge as they did, through the one shim
that reads them (`PairFacts.from_marks`)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from opdiff.comparison.facts import PairFacts
from opdiff.comparison.result import CompareResult


def as_older(result: CompareResult) -> CompareResult:
    """`result` as an opdiff before summary.json held facts wrote it: no facts, its rows
    marked instead (`TensorRow.boundary`, as `PairFacts.from_marks` documents the marks)."""
    marks: dict[tuple[Any, Any, Any], list[str]] = {}      # (step, rank, row) -> its marks

    def mark(f: PairFacts, row: Any, tag: str) -> None:
        tags = marks.setdefault((f.step, f.rank, row), [])
        tags += [] if tag in tags else [tag]

    for f in result.facts:
        for r in result.rows:
            if (not result.pairs or (f.step, f.rank) == (r.step, r.rank)) and \
                    r.op_name in {*f.withheld, *f.exposed}:
                mark(f, r.target_name, ("withheld:" if r.op_name in f.withheld
                                        else "exposed:") + r.op_name)
        for region in f.regions:
            once = [f"module:{region.name}:{region.module}"] if region.module else []
            once += [f"{k}:{region.name}:{json.dumps(list(v))}"
                     for k, v in (("unpaired", region.unpaired), ("through", region.through)) if v]
            readers, made = {r[0]: list(r[1:]) for r in region.readers}, dict(region.made)
            for side, rows in (("in", region.inputs), ("out", region.outputs)):
                for row in rows:
                    tags = [f"{side}:{region.name}", *once]
                    once = []
                    if side == "in" and row in readers:
                        tags.append(f"reads:{region.name}:{json.dumps(readers[row])}")
                    if side == "out" and row in made:
                        tags.append(f"made:{region.name}:{made[row]}")
                    for tag in tags:
                        mark(f, row, tag)
        for pair in f.forced:
            for side, rows in (("in", pair.inputs), ("unjudged", pair.unjudged)):
                for row in rows:
                    mark(f, row, f"{side}:{pair.name}")
    rows = [dataclasses.replace(r, boundary=tuple(marks.get(
        ((r.step, r.rank) if result.pairs else (result.step, result.rank)) + (r.target_name,), [])))
        for r in result.rows]
    return dataclasses.replace(result, facts=[], rows=rows)
