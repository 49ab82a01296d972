"""The token positions at which a culprit's output differs, in words: which real tokens of which
matched sequence, with each side's row and position."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence as Seq

from ...store.records import iter_tensors
from ..result import Divergence, TensorRow
from .sequences import Match
from .slicing import FLAT, Cut
from ...store.schema import Descriptor
from ...store.source import DumpSource


def _descriptor(source: DumpSource, name: Optional[str]) -> Optional[Descriptor]:
    if not name:
        return None
    for record in source.records():
        if name.startswith(record["name"]):
            for found, _, desc in iter_tensors(record):
                if found == name:
                    return desc
    return None


def _cut(source: DumpSource, key: str) -> Optional[Cut]:
    spec = getattr(source, "cuts", {}).get(key)
    return spec[1] if spec is not None else None


def _part(source: DumpSource, key: str, k: int, n: int) -> Any:
    """Sequence k's part of a tensor: cut by its side, or the whole one where only one
    sequence was matched and that side did not need cutting."""
    part = getattr(source, "part", None)
    if part is not None:
        return part(key, k)
    return source.tensor(key) if n == 1 else None


def token_positions(divergence: Divergence, rows: Seq[TensorRow], target: DumpSource, golden: DumpSource,
                    matches: Seq[Match]) -> str:
    """"" when the culprit's tensors cannot be read or hold no token dim."""
    import torch

    row = next((r for r in rows if r.target_name == divergence.tensor and r.golden_name), None)
    if row is None:
        return ""
    t_desc, g_desc = _descriptor(target, row.target_name), _descriptor(golden, row.golden_name)
    if not t_desc or not g_desc or not t_desc.get("key") or not g_desc.get("key"):
        return ""
    dim, offset = _token_dim(target, golden, t_desc["key"], g_desc["key"])
    if dim is None:
        return ""
    said = []
    for k, m in enumerate(matches):
        t, g = _part(target, t_desc["key"], k, len(matches)), \
            _part(golden, g_desc["key"], k, len(matches))
        if t is None or g is None or t.shape != g.shape or t.dim() <= dim or \
                not (t.is_floating_point() and g.is_floating_point()):
            return ""
        eps = max(torch.finfo(t.dtype).eps, torch.finfo(g.dtype).eps)
        part = (t.double() - g.double()).abs()
        length = part.shape[dim]
        err = part.movedim(dim, 0).reshape(length, -1).amax(1)
        scale = float(g.double().abs().max()) or 1.0
        bad = [p for p in range(length) if float(err[p]) > 16 * eps * scale]
        if not bad:
            continue
        worst = int(err.argmax())
        first, worst = bad[0] + offset, worst + offset
        where = "its one real token" if length == 1 else f"every one of its {length} real " \
            "tokens" if len(bad) == length else f"{len(bad)} of its {length} real tokens"
        said.append(f"sequence {k}: at {where} "
                    f"(first at position {first}), most at position {worst} (golden row "
                    f"{m.golden.row} position {m.golden.positions[worst]}, target row "
                    f"{m.target.row} position {m.target.positions[worst]})")
    if not said:
        return ""
    return f"{divergence.name} differs on its tokens: " + "; ".join(said)


# A module call's first output whose module path ends in an index (a ModuleList's item: a
# decoder layer, an encoder block), e.g. Module.model.layers.3.LlamaDecoderLayer.forward.0.output.0
_LAYER = re.compile(r"^Module\.(?P<path>.+\.\d+)\.[A-Za-z_]\w*\.forward\.\d+\.output\.0$")


@dataclass(frozen=True)
class TokenErrors:
    """The relative error of each layer's output at each real token of the first matched
    sequence, target against golden: errors[i][p] = |t - g| / |g| over the token's values
    (L2), layer `layers[i]` at position `positions[p]` of the sequence."""

    layers: tuple[str, ...]
    positions: tuple[int, ...]
    errors: tuple[tuple[float, ...], ...]

    def to_json(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "positions": list(self.positions),
                "errors": [list(row) for row in self.errors]}

    @classmethod
    def from_json(cls, data: object) -> Optional["TokenErrors"]:
        if not isinstance(data, dict):
            return None
        try:
            return cls(tuple(map(str, data["layers"])), tuple(map(int, data["positions"])),
                       tuple(tuple(float(e) for e in row) for row in data["errors"]))
        except (KeyError, TypeError, ValueError):
            return None


def token_errors(rows: Seq[TensorRow], target: DumpSource, golden: DumpSource, matches: Seq[Match]
                 ) -> Optional[TokenErrors]:
    """Each layer output's error per token of the first matched sequence (None: no layer
    output holds a token dim both sides' tensors can be read at)."""
    import torch

    layers, errors, positions = [], [], None
    for row in rows:
        found = _LAYER.match(row.target_name or "")
        if found is None or not row.golden_name:
            continue
        t_desc, g_desc = _descriptor(target, row.target_name), _descriptor(golden, row.golden_name)
        if not t_desc or not g_desc or not t_desc.get("key") or not g_desc.get("key"):
            continue
        dim, offset = _token_dim(target, golden, t_desc["key"], g_desc["key"])
        if dim is None:
            continue
        t, g = _part(target, t_desc["key"], 0, len(matches)), \
            _part(golden, g_desc["key"], 0, len(matches))
        if t is None or g is None or t.shape != g.shape or t.dim() <= dim or \
                not (t.is_floating_point() and g.is_floating_point()):
            continue
        length = t.shape[dim]
        if positions is not None and len(positions) != length:
            continue
        positions = tuple(range(offset, offset + length))
        diff = (t.double() - g.double()).movedim(dim, 0).reshape(length, -1).norm(dim=1)
        norm = g.double().movedim(dim, 0).reshape(length, -1).norm(dim=1)
        rel = diff / norm.clamp_min(torch.finfo(torch.float64).tiny)
        layers.append(found.group("path"))
        errors.append(tuple(float(e) for e in rel))
    if not layers or positions is None:
        return None
    return TokenErrors(tuple(layers), positions, tuple(errors))


def _token_dim(target: DumpSource, golden: DumpSource, t_key: str, g_key: str
               ) -> tuple[Optional[int], int]:
    """The token dim of a tensor as the sides cut it, and the position its part starts at."""
    cut = _cut(target, t_key) or _cut(golden, g_key)
    if cut is None:
        return None, 0
    if cut.lead == FLAT:
        return 0, 0
    if cut.tokens:
        return cut.tokens[0], 0
    if cut.windows:
        return cut.windows[0][0], cut.windows[0][1]
    return None, 0


__all__ = ["token_positions", "token_errors", "TokenErrors"]
