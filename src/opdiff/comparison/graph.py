"""One side's records as a graph, indexed once per pair for the finders that read it: each
record by its `seq` (what `"producer": [seq, slot]` on an input names), which ops read each
record's outputs (the dump's dataflow) and each module call's parent call.

    graph = RunGraph(records)
    graph.by_seq[seq]       # the record of that seq (records without one are not indexed)
    graph.at[seq]           # ... its index in `records`
    graph.readers[i]        # indices of the ops that read an output of record i
    graph.parents[name]     # the module call a module call ran in (None at the top)

The finders of a pair share one graph per side and per list of records: the region finders
(`regions.find_regions`, `regions.absorb`, `region_cover.covered_tensors`, `forced.fed_ops`,
`region_boundaries.Boundaries`, `forced.CarriedInputs`: `pair.py`), the compiled pairing
(`compiled.linked`: `verify`, `link_backward`, `compiled_params.link_modules`) and the compiled
boundaries (`compiled_modules.module_calls`, `compiled_spans.span_calls`). Called alone, each
builds its own. A graph indexes one list: a rewritten or filtered list gets its own.
"""
from __future__ import annotations

from functools import cached_property
from typing import Optional, Sequence

from ..store.records import iter_tensors
from ..store.schema import Kind, Record, Role



def readers_of(records: Sequence[Record]) -> dict[int, list[int]]:
    """record index -> the indices of the ops that read one of its outputs (dataflow)."""
    at = {rec["seq"]: i for i, rec in enumerate(records)}
    readers: dict[int, list[int]] = {}
    for i, rec in enumerate(records):
        if rec["kind"] == Kind.MODULE:
            continue
        for _, role, desc in iter_tensors(rec):
            producer = desc.get("producer")
            if role == Role.INPUT and producer and producer[0] in at:
                readers.setdefault(at[producer[0]], []).append(i)
    return readers


class RunGraph:
    """One side's records (as alignment sees them), indexed on first use."""

    def __init__(self, records: Sequence[Record]) -> None:
        self.records = records

    @cached_property
    def by_seq(self) -> dict[int, Record]:
        return {r["seq"]: r for r in self.records if r["seq"] is not None}

    @cached_property
    def at(self) -> dict[int, int]:
        return {r["seq"]: i for i, r in enumerate(self.records) if r["seq"] is not None}

    @cached_property
    def readers(self) -> dict[int, list[int]]:
        return readers_of(self.records)

    @cached_property
    def parents(self) -> dict[str, Optional[str]]:
        return {r["name"]: r["module"] for r in self.records if r["kind"] == Kind.MODULE}


__all__ = ["RunGraph", "readers_of"]
