"""What two dumps written by different tools can be compared on.

opdiff records an op's backward as the gradients its own autograd node receives and returns, and
a module's backward as the gradients of its whole input and output. msprobe (and the tools before
it) records an API's backward through the last autograd node the API made, and a module's input
gradient as that module's share only. Both are right for their own tool; across the two they
measure different tensors under one name, and pairing them names innocent ops (a healthy Llama
against its msprobe dump blamed `Functional.cross_entropy.0.backward`). Forward records and
parameter gradients mean the same in every format, so those are what a mixed pair compares.
"""
from __future__ import annotations

from typing import Optional

from ..store.schema import Kind, Phase, Record

# backward records whose tensors depend on how the tool hooked autograd
_TOOL_SHAPED = (Kind.API, Kind.MODULE, Kind.ATEN)


def comparable(t_records: list[Record], g_records: list[Record], t_format: str,
               g_format: str) -> tuple[list[Record], list[Record], Optional[str]]:
    """The records of each side that mean the same in both formats, and a note when some were
    left out. Dumps of one format (or of two foreign tools that hook alike) are returned whole."""
    if (t_format == "opdiff") == (g_format == "opdiff"):
        return t_records, g_records, None
    kept_t, kept_g = _forward_meaning(t_records), _forward_meaning(g_records)
    dropped = (len(t_records) - len(kept_t)) + (len(g_records) - len(kept_g))
    if not dropped:
        return t_records, g_records, None
    foreign = g_format if t_format == "opdiff" else t_format
    note = (f"backward records of ops and modules not paired across formats ({t_format} target, "
            f"{g_format} golden: {foreign} records an op's backward through a different autograd "
            f"node); forward records and parameter gradients are compared")
    return kept_t, kept_g, note


def _forward_meaning(records: list[Record]) -> list[Record]:
    return [r for r in records
            if not (r["phase"] == Phase.BACKWARD and r["kind"] in _TOOL_SHAPED)]
