"""What a region's rows keep so that `rejudge` judges it, and words it, as the compare did.

A compare judges a region (`regions.py`) through its boundary rows and says, when it is blamed,
how its ops read the tensors entering it (`query`, `key`, `value` of SDPA; `grad_output` of a
backward region), which tensor it made (`Divergence.tensor`), its module call and the parameters
it could not compare (`region_verdict.py`). `rejudge` reads no dump; it finds all of that again
in the marks (`TensorRow.boundary`, kept in rows.jsonl) that `mark_boundaries` leaves:

    in:Region.2.forward                   a tensor entering it (measured where it was made)
    out:Region.2.forward                  a tensor leaving it (measured where it is read)
    reads:Region.2.forward:["Functional.scaled_dot_product_attention", "0", ""]
                                          ... entering as that op's argument "0" (`RegionOps.readers`)
    made:Region.2.forward:Functional.scaled_dot_product_attention.0.forward.output.0
                                          ... leaving: the tensor the region made
    module:Region.2.forward:Module.model.layers.0.self_attn.LlamaAttention.forward.0
    unpaired:Region.2.forward:["model.layers.0.self_attn.qkv_proj.weight"]
    through:Region.4.forward:["Inductor.cpp_fused_add_embedding_mean_mul_pow_rsqrt_0.0.forward"]

(the last three once per region, on its first boundary row). Rows written before the last four
existed re-judge as they did: inputs by their measured names.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..store.schema import Kind, RecordName
from .regions import REGION, Region, RegionOps, label_number

IN, OUT, READS, MADE, MODULE, UNPAIRED, THROUGH = \
    "in", "out", "reads", "made", "module", "unpaired", "through"


def mark_boundaries(rows: list[Any], region_ops: list[Any]) -> None:
    """Mark the boundary rows of each region judged (`region_ops`: OpScores of kind region)."""
    for op in region_ops:
        region, listed, made = op.region
        facts = [f"{MODULE}:{op.name}:{region.module}"] if region.module else []
        if region.unpaired_leaves:
            facts.append(f"{UNPAIRED}:{op.name}:{json.dumps(region.unpaired_leaves)}")
        if region.through:
            facts.append(f"{THROUGH}:{op.name}:{json.dumps(region.through)}")
        for side, entries in ((IN, op.inputs), (OUT, op.outputs)):
            for i, *_ in entries:
                row = rows[i]
                name = row.target_name or ""
                tags = [f"{side}:{op.name}", *facts]
                facts = []
                if side == IN and name in listed.readers:
                    tags.append(f"{READS}:{op.name}:{json.dumps(list(listed.readers[name]))}")
                if side == OUT and made.get(name, name) != name:
                    tags.append(f"{MADE}:{op.name}:{made[name]}")
                rows[i] = replace(row, boundary=row.boundary + tuple(
                    t for t in tags if t not in row.boundary))


def regions_from_rows(rows: list[Any], entries: dict[int, Any], score: Any
                      ) -> tuple[list[Any], dict[int, list[int]]]:
    """The regions of a compare from its rows: (their scores, made by `score(**fields)`
    (`blame.OpScore`), with the boundary entries `entries` (row index -> measured entry) hold;
    region number -> its rows). Their ops' rows carry `TensorRow.region`."""
    region_rows: dict[int, list[int]] = {}
    listed: dict[int, RegionOps] = {}
    for i, row in enumerate(rows):
        number = label_number(row.region) if row.region else None
        if number is None:
            continue
        region_rows.setdefault(number, []).append(i)
        ops = listed.setdefault(number, RegionOps())
        if row.kind not in Kind.OPS:
            continue        # a one-sided tensor of a paired module call it covers: not its op
        listing = ops.target_ops if row.target_name else ops.golden_ops
        if not any(o["name"] == row.op_name for o in listing):
            loc = row.stack[0] if row.stack else None
            parsed = RecordName.parse(row.op_name)
            listing.append({"name": row.op_name, "op": parsed.op if parsed else row.op_name,
                            "location": None if loc is None else {"file": loc.file,
                                                                  "line": loc.line,
                                                                  "code": loc.code},
                            "module": row.module})
    found: dict[str, Any] = {}
    for i, row in enumerate(rows):
        for mark in row.boundary:
            kind, _, rest = mark.partition(":")
            name, _, value = rest.partition(":")
            parts = name.split(".")
            number = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
            if number is None or number not in region_rows or kind not in (
                    IN, OUT, READS, MADE, MODULE, UNPAIRED, THROUGH):
                continue
            op = found.get(name) or _score(found, name, number, rows, region_rows[number],
                                           listed[number], score)
            region, ops, made = op.region
            if kind in (IN, OUT) and i in entries:
                (op.outputs if kind == OUT else op.inputs).append(entries[i])
            elif kind == READS and row.target_name:
                reader = _strings(value, 3)
                if reader is not None:
                    ops.readers[row.target_name] = tuple(reader)
            elif kind == MADE and row.target_name and value:
                made[row.target_name] = value
            elif kind == MODULE and value:
                region.module = op.module = value
            elif kind == UNPAIRED:
                region.unpaired_leaves = _strings(value) or []
            elif kind == THROUGH:
                region.through = _strings(value) or []
    return list(found.values()), region_rows


def _score(found: dict[str, Any], name: str, number: int, rows: list[Any], indices: list[int],
           ops: RegionOps, score: Any) -> Any:
    """A region's score, as the compare made it (`pair.py`), from its rows."""
    phase = name.split(".")[2]
    label = rows[indices[0]].region or ""
    first = next((rows[i] for i in indices if rows[i].target_name), rows[indices[0]])
    region = Region(number, phase, [], [], position=rows[indices[0]].index,
                    place=label.split(" in ", 1)[1] if " in " in label else "")
    op = found[name] = score(name=name, op="Region", phase=phase, kind=REGION,
                             module=first.module, forward=None, seq=rows[indices[0]].index,
                             location=first.stack[0] if first.stack and first.target_name
                             else None)    # (golden's ops alone: no target line)
    op.region = (region, ops, {})
    return op


def _strings(text: str, size: int = -1) -> Any:
    """A JSON list of strings (of `size` items when given), or None (a mark is untrusted)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or \
            (size >= 0 and len(value) != size):
        return None
    return value


__all__ = ["mark_boundaries", "regions_from_rows", "IN", "OUT", "READS", "MADE", "MODULE",
           "UNPAIRED", "THROUGH"]
