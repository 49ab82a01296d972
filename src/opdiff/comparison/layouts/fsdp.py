"""FSDP2 (`fully_shard`) read as the one-device run it splits: its parameter all-gathers.

Before a module's forward, FSDP2 gathers its parameters: `Torch.empty` buffers,
`Torch.all_gather_copy_in`, the all-gather, `Tensor.view`s of the staging buffers,
`Torch.split_with_sizes_copy` and, the first time, one `Torch.as_strided` per parameter
(`torch.ops.fsdp`'s own ops), each followed by a `Tensor.detach` when the parameters are
tensor-parallel DTensors (FSDP2 x TP). `Unshards` finds these runs in a rank's records: layout ops, left
out of the logical run.

The module's ops then read its whole parameters, which capture does not know as parameters
(the registered ones are the shards): no leaf record is written where the one-device run writes
one, just before the op that first reads it. `name_gathered` finds which parameter such an
input is among the optimizer step's sharded parameter leaves (`Shard(0)` DTensors, merged
whole), by shape and statistics (max and min exactly, mean and norm to 1e-9: the merged
statistics are exact to float64 rounding), in parameter order among equals; the logical run
gets the parameter's leaf record there, and the optimizer step's leaf of its shards is left
out (the same values, already seen). An input none matches stays as it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ...store.records import decode_float
from ...store.schema import Kind, Phase, record_name, Record, Descriptor, Statistics

_GATHER_IN, _GATHER_OUT, _VIEW = ("Torch.all_gather_copy_in", "Torch.split_with_sizes_copy",
                                  "Torch.as_strided")
_STAGING = ("Torch.empty", "Tensor.view")


class Unshards:
    """Feed one rank's records in order (`feed`); `positions`: its FSDP2 parameter
    all-gather runs."""

    def __init__(self) -> None:
        self.positions: set[int] = set()
        self._block: list[int] = []      # positions since a possible run began
        self._state = ""                 # "", "start" (empties), "gather" (copy-in), "views"

    def feed(self, pos: int, rec: Record) -> None:
        op, state = str(rec.get("op")), self._state
        if state == "views" and (op == _VIEW or op == "Tensor.detach"):
            self.positions.add(pos)
        elif state == "gather" and (op in _STAGING or op.startswith("Distributed.all_gather")):
            self._block.append(pos)
        elif state == "gather" and op == _GATHER_OUT:
            self.positions.update(self._block)
            self.positions.add(pos)
            self._block, self._state = [], "views"
        elif op == _GATHER_IN and state in ("", "start", "views"):
            self._block = (self._block if state == "start" else []) + [pos]
            self._state = "gather"
        elif op == "Torch.empty":
            self._block = (self._block if state == "start" else []) + [pos]
            self._state = "start"
        else:
            self._block, self._state = [], ""


def _close(a: Optional[Statistics], b: Optional[Statistics]) -> bool:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return True                  # no statistics (a tensor dump without them): by shape
    try:
        x = {k: float(decode_float(a[k])) for k in ("max", "min", "mean", "norm")}
        y = {k: float(decode_float(b[k])) for k in ("max", "min", "mean", "norm")}
    except (KeyError, TypeError, ValueError):
        return True
    if x["max"] != y["max"] or x["min"] != y["min"]:
        return all(math.isnan(v) for v in (x["max"], y["max"])) and x["min"] == y["min"]
    return all(math.isclose(x[k], y[k], rel_tol=1e-9, abs_tol=1e-300) for k in ("mean", "norm"))


@dataclass
class Read:
    pos: int                       # the reading record's position
    path: str                      # which of its inputs
    shape: list[int]
    stats: Optional[Statistics]


@dataclass
class Sharded:
    pos: int                       # the optimizer-time parameter leaf's position
    fqn: str
    shape: list[int]               # merged: the whole parameter's
    stats: Optional[Statistics]


def name_gathered(reads: Sequence[Read], sharded: Sequence[Sharded]
                  ) -> list[tuple[Read, Sharded]]:
    """(the first read of a gathered parameter, the sharded parameter it is the whole of)."""
    out: list[tuple[Read, Sharded]] = []
    used: set[int] = set()
    for r in reads:
        for s in sharded:
            if s.pos not in used and s.shape == r.shape and _close(r.stats, s.stats):
                out.append((r, s))
                used.add(s.pos)
                break
    return out


def as_leaf(reader: Record, desc: Descriptor, fqn: str) -> Record:
    """The leaf record of parameter `fqn`, read first (as `desc`) by the record `reader`."""
    op = f"Parameter.{fqn}"
    own = desc.copy()
    own.pop("producer", None)
    own.pop("leaf", None)
    own.pop("fqn", None)
    return {"name": record_name(op, Phase.FORWARD, 0), "op": op, "kind": Kind.LEAF,
            "phase": Phase.FORWARD, "leaf": "parameter", "tensor": fqn,
            "reader": reader.get("name"), "module": reader.get("module"),
            "stack": reader.get("stack"), "outputs": [own], "seq": None}


__all__ = ["Unshards", "Read", "Sharded", "name_gathered", "as_leaf"]
