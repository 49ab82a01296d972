"""Expert parallelism, recognised and not merged: `routed`.

Under expert parallelism each rank holds some of a mixture of experts' experts and its own part
of the batch; an all-to-all sends each token to its expert's rank and another sends the result
back. The ranks then run different ops on different tokens (each expert on the tokens routed to
it from every rank), which neither the tensor/data-parallel merge (`merged.py`: the ranks' k-th
records are one call) nor the pipeline chain (`chain.py`: point-to-point sends) describes:
merged as either, the pair names innocent ops. So a side whose ranks ran an all-to-all over
their group is said to be inconclusive and not compared:

    why = routed(rank_dumps)      # "... all_to_all_single ..." or None
"""
from __future__ import annotations

from typing import Optional, Sequence

from ... import ops
from ...store.schema import Phase
from ...store.source import DumpSource

def routed(sources: Sequence[DumpSource]) -> Optional[str]:
    """What says the ranks routed tensors between them (their first all-to-all over two or
    more of them), or None. One pass over the first rank's forward records (every rank of the
    group runs the same collectives; the dispatch is in the forward)."""
    if len(sources) < 2:
        return None
    for rec in sources[0].records():
        if rec["phase"] == Phase.BACKWARD:
            return None
        if not ops.traits(rec["op"]).routes:
            continue
        group = rec.get("group")
        ranks = group.get("ranks") if isinstance(group, dict) else None
        if isinstance(ranks, list) and len(ranks) >= 2:
            return f"{rec['name']} over ranks {sorted(ranks)}"
    return None


__all__ = ["routed"]
