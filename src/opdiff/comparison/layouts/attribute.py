"""Which rank's piece of a merged culprit differs: `name_ranks`.

The comparison names the first logical op whose inputs agree and whose outputs do not. Its
worst output was joined from the ranks' pieces (`MergedSource.pieces`); with saved tensors each
piece is measured against the same slice of the other side's tensor, and the ranks whose pieces
differ are named (the divergence's `rank`, and its reason). From statistics alone a piece
cannot be told from another (the other side's statistics are of the whole): the reason says
which ranks hold pieces, and the rank stays the pair's.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from ...store.records import iter_tensors
from ...store.schema import Descriptor
from ...store.source import DumpSource
from ..result import CompareResult, Divergence
from .placement import PARTIAL, SHARD


def _find(source: DumpSource, tensor: str) -> Optional[Descriptor]:
    for record in source.records():
        for name, _role, desc in iter_tensors(record):
            if name == tensor:
                return desc
    return None


def _piece_errors(merged: Any, tensor: str, golden: Any,
                  scale: Optional[float] = None) -> Optional[dict[int, float]]:
    """{rank: max |target - golden| / max |golden|} over each rank's piece; None when the
    pieces cannot be measured apart (statistics; partial sums, whose pieces are summands). A
    piece itself merged (a 2-D mesh's group) is measured by its own pieces' ranks."""
    import torch

    layout = merged.layout_of(tensor)
    if layout is None or layout[0] == PARTIAL or golden is None:
        return None
    kind, dim = layout
    out: dict[int, float] = {}
    g = golden.detach().to(torch.float64)
    if scale is None:
        scale = float(g.abs().max()) if g.numel() else 0.0
    recipe = merged.recipe(tensor)
    for piece, (i, key), c in zip(merged.pieces(tensor), recipe, merged.coefficients(tensor)):
        t = merged.sources[i].tensor(key)
        if t is None:
            return None
        t = t.detach().to(torch.float64) * c
        if kind == SHARD:
            part = g.narrow(dim, int(piece.get("offset", 0)), t.shape[dim])
        else:
            part = g
        if tuple(part.shape) != tuple(t.shape):
            return None
        inner = merged.sources[i]
        nested = _piece_errors(inner, key, part / c, scale) \
            if hasattr(inner, "layout_of") and c != 0 else None
        if nested:                    # a 2-D mesh: the ranks of the group this piece joined
            out.update(nested)
            continue
        err = float((t - part).abs().max()) if t.numel() else 0.0
        out[int(piece["rank"])] = err / scale if scale > 0 else err
    return out


def _guilty(errors: dict[int, float]) -> list[int]:
    worst = max(errors.values(), default=0.0)
    if worst <= 0:
        return []
    return sorted(r for r, e in errors.items() if e >= worst / 10)


def name_ranks(result: CompareResult, target: DumpSource, golden: DumpSource) -> CompareResult:
    """`result` with its first divergence's rank and reason naming the rank(s) whose piece of
    the culprit's output differs, when a side is merged (`MergedSource`); as it is otherwise."""
    return named_ranks(result, target, golden)[0]


def named_ranks(result: CompareResult, target: DumpSource, golden: DumpSource
                ) -> tuple[CompareResult, tuple[int, ...]]:
    """`name_ranks`, and the ranks it named: those whose piece of the culprit's output differs,
    or the pipeline stage's rank that ran it; () where it named none (no culprit, or
    statistics that cannot tell the pieces apart)."""
    from .chain import ChainedSource
    from .merged import MergedSource

    fd = result.first_divergence
    if fd is not None and isinstance(target, ChainedSource):
        ran = target.rank_of(fd.name)
        if ran is None:
            return result, ()
        stage = target.ranks.index(ran)
        return replace(result, first_divergence=replace(
            fd, rank=ran, reason=f"{fd.reason}; run on rank {ran} (pipeline stage {stage})")), \
            (ran,)
    if fd is None or not fd.tensor or not isinstance(target, MergedSource):
        return result, ()
    row = next((r for r in result.rows if r.target_name == fd.tensor), None)
    desc = _find(target, fd.tensor)
    if desc is None:
        return result, ()
    pieces = target.pieces(fd.tensor)
    ranks = [int(p["rank"]) for p in pieces]
    errors = None
    if row is not None and row.golden_name and target.holds_tensors:
        g_desc = _find(golden, row.golden_name)
        g_tensor = golden.tensor(g_desc["key"]) if g_desc and "key" in g_desc else None
        errors = _piece_errors(target, fd.tensor, g_tensor)
    guilty = _guilty(errors) if errors else []
    if errors:
        ranks = sorted(errors)
    where = desc.get("layout", "")
    if guilty:
        shown = ", ".join(f"rank {r}" for r in guilty)
        said = (f"; the difference is in {shown}'s piece of {fd.tensor} ({where} over ranks "
                f"{ranks}; the other pieces agree)" if len(guilty) < len(ranks) else
                f"; every rank's piece of {fd.tensor} differs ({where} over ranks {ranks})")
        rank: "int | None" = guilty[0]
    else:
        said = (f"; {fd.tensor} was merged from ranks {ranks} ({where}): statistics cannot say "
                f"which rank's piece differs" if ranks else "")
        rank = fd.rank
    divergence: Divergence = replace(fd, rank=rank, reason=fd.reason + said)
    return replace(result, first_divergence=divergence), tuple(guilty)


__all__ = ["name_ranks", "named_ranks"]
