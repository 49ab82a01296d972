"""A judged region as typed facts, and back: what `rejudge` needs to judge and word a region as
the compare did, without the dumps.

A compare judges a region (`regions.py`) through its boundary rows and says, when it is blamed,
how its ops read the tensors entering it (`query`, `key`, `value` of SDPA; `grad_output` of a
backward region), which tensor it made (`Divergence.tensor`), its module call and the
parameters it could not compare (`region_verdict.py`). `facts_of` keeps that of each region
judged as a `facts.RegionFacts` (saved in summary.json with the pair's facts); `units_of` makes
the region's score again from them and the rows:

    facts = facts_of(region_ops, rows)                    # the compare, after judging
    region_ops, region_rows = units_of(facts, rows, entries)    # rejudge

Results written before the facts were saved kept them as row marks: `facts.PairFacts.from_marks`
reads those into the same facts. Rows written before a region's marks held how its ops read its
inputs re-judge as they did: inputs by their measured names.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..store.schema import Kind, RecordName
from .blame import OpScore
from .facts import RegionFacts
from .regions import REGION, Region, RegionOps, RegionUnit, source_line
from .result import TensorRow
from .scores import Entry


def facts_of(region_ops: Sequence[OpScore], rows: Sequence[TensorRow]) -> list[RegionFacts]:
    """The facts of each region judged (`region_ops`: scores of kind region)."""
    out = []
    for op in region_ops:
        unit = op.region
        if unit is None:
            continue
        region, listed = unit.region, unit.listed
        inputs = [rows[i].target_name or "" for i, *_ in op.inputs]
        outputs = [rows[i].target_name or "" for i, *_ in op.outputs]
        out.append(RegionFacts(
            region.number, region.phase, region.where, region.boundary, region.position,
            tuple(inputs), tuple(outputs),
            tuple((name, *listed.readers[name]) for name in dict.fromkeys(inputs)
                  if name in listed.readers),
            tuple((name, unit.made[name]) for name in dict.fromkeys(outputs)
                  if unit.made.get(name, name) != name),
            region.module, tuple(region.unpaired_leaves), tuple(region.through)))
    return out


def units_of(regions: Sequence[RegionFacts], rows: Sequence[TensorRow], entries: dict[int, Entry]
             ) -> tuple[list[OpScore], dict[int, list[int]]]:
    """The scores of the regions judged (`regions`), with the boundary entries `entries` (row
    index -> measured entry) hold; region number -> its rows (those carrying its label)."""
    by_label = {facts.label: facts for facts in regions}
    region_rows: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        facts = by_label.get(row.region or "")
        if facts is not None:
            region_rows.setdefault(facts.number, []).append(i)
    measured = {rows[i].target_name: entry for i, entry in entries.items() if rows[i].target_name}
    out = []
    for facts in regions:
        indices = region_rows.get(facts.number)
        if indices:
            out.append(_unit(facts, rows, indices, measured))
    return out, region_rows


def _unit(facts: RegionFacts, rows: Sequence[TensorRow], indices: list[int],
          measured: dict[Optional[str], Entry]) -> OpScore:
    """A region's score as the compare made it (`pair.py`), from its facts and rows."""
    first = next((rows[i] for i in indices if rows[i].target_name), rows[indices[0]])
    position = facts.position if facts.position is not None else rows[indices[0]].index
    region = Region(facts.number, facts.phase, [], [], module=facts.module, position=position,
                    boundary=facts.how, place=facts.where,
                    unpaired_leaves=list(facts.unpaired), through=list(facts.through))
    listed = _listed(rows, indices)
    listed.readers.update({tensor: (op, key, fqn) for tensor, op, key, fqn in facts.readers})
    op = OpScore(name=facts.name, op="Region", phase=facts.phase, kind=REGION,
                 module=facts.module or first.module, forward=None, seq=position,
                 location=first.stack[0] if first.stack and first.target_name else None,
                 inputs=[measured[t] for t in facts.inputs if t in measured],
                 outputs=[measured[t] for t in facts.outputs if t in measured])
    op.region = RegionUnit(region, listed, dict(facts.made))   # (golden's ops alone: no target line)
    return op


def _listed(rows: Sequence[TensorRow], indices: list[int]) -> RegionOps:
    """Each side's ops of a region, with their first source line, from its rows."""
    listed = RegionOps()
    for i in indices:
        row = rows[i]
        if row.kind not in Kind.OPS:
            continue        # a one-sided tensor of a paired module call it covers: not its op
        listing = listed.target_ops if row.target_name else listed.golden_ops
        if not any(o["name"] == row.op_name for o in listing):
            parsed = RecordName.parse(row.op_name)
            listing.append({"name": row.op_name, "op": parsed.op if parsed else row.op_name,
                            "location": source_line(row.stack[0] if row.stack else None),
                            "module": row.module})
    return listed


__all__ = ["facts_of", "units_of"]
