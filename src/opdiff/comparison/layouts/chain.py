"""Pipeline stages chained into one run: `ChainedSource`.

Under pipeline parallelism each rank runs a stage: its part of the forward, the activations
sent on to the next stage's rank, the gradients sent back. The logical one-device run is the
stages' forward parts in stage order, their backward parts in reverse order, then what each
ran after backward (its optimizer step), in stage order:

    chained = ChainedSource(rank_dumps)        # ranks in stage order; pass one runs here
    chained.records()                          # renumbered: Functional.linear.0 of stage 1 is
                                               # the logical run's Functional.linear.2

Left out: the point-to-point sends and receives, the `detach` that made what a send sends and
the empty buffer a receive fills, and a later stage's `Input` leaf (an activation it received).
A received activation's readers name the op that made it on the sending rank (dataflow
crosses the send). Each descriptor's `pieces` names the one rank it came from.
"""
from __future__ import annotations

import copy
from typing import Any, Iterator, Optional, Sequence

from ...store.records import iter_tensors, producer_of, producer_ref
from ...store.schema import Group, Kind, Phase, Record, RecordName
from ...store.source import DumpSource
from .merged import RankGroup
from .placement import Unsupported

_MADE_FOR_RECV = ("Torch.empty", "Torch.empty_like", "Torch.zeros", "Torch.zeros_like")
_SENT_COPY = ("Tensor.detach", "Tensor.clone", "Tensor.contiguous")
_P2P = ("Distributed.send", "Distributed.recv", "Distributed.isend", "Distributed.irecv")
Key = tuple[int, int, str]          # (rank index, seq, slot)


def _p2p(rec: Record) -> bool:
    group = rec.get("group")
    return rec.get("op") in _P2P and isinstance(group, dict) and "peer" in group


class ChainedSource(RankGroup):
    """One step of a pipeline's ranks, as one logical `DumpSource` (see the module docstring)."""

    def __init__(self, sources: Sequence[DumpSource], ordered: bool = False):
        super().__init__(sources, ordered)         # ordered: in stage order (a layout file's)
        if not ordered:
            self.sources = _stage_order(self.sources)
        self.ranks = [int(s.rank if s.rank is not None else i) for i, s in enumerate(self.sources)]
        self.meta["logical"] = {"ranks": self.ranks, "pipeline": True}
        self.dropped: list[set[int]] = [set() for _ in self.sources]
        self.segments: list[tuple[int, int, int]] = []       # (rank index, first pos, end pos)
        self.alias: dict[Key, Key] = {}
        self.seqs: dict[tuple[int, int], int] = {}
        self.names: dict[tuple[int, str], str] = {}
        self.kept = 0
        self._origin: dict[str, int] = {}                     # logical record name -> rank index
        self._copies: dict[tuple[int, int], int] = {}         # (rank index, seq) -> pos
        self._plan()

    # -- pass one -------------------------------------------------------------------------------
    def _plan(self) -> None:
        spans: list[tuple[int, int, int]] = []                # (backward start, end, length)
        sent: dict[tuple[int, int, int], Key] = {}            # (sender, receiver, group seq)
        any_p2p = False
        for r, source in enumerate(self.sources):
            made: dict[tuple[int, ...], int] = {}
            first_bwd, last_bwd, pos = -1, -1, -1
            for pos, rec in enumerate(source.records()):
                got = rec.get("seq")
                seq: int = got if isinstance(got, int) else pos
                op = str(rec.get("op"))
                if rec.get("phase") == Phase.BACKWARD:
                    first_bwd = pos if first_bwd < 0 else first_bwd
                    last_bwd = pos
                ins = [d for _, role, d in iter_tensors(rec) if role == "input"]
                if op in _MADE_FOR_RECV:
                    outs = [d for _, role, d in iter_tensors(rec) if role == "output"]
                    if outs:
                        made[tuple(outs[0].get("shape") or ())] = pos
                if _p2p(rec):
                    any_p2p = True
                    self.dropped[r].add(pos)
                    group = rec["group"]
                    peer = self.ranks.index(int(group["peer"])) if int(group["peer"]) in self.ranks \
                        else -1
                    if op.endswith("send") and ins:
                        src = producer_of(ins[0])
                        key: Key = (r, src[0], src[1]) if src else (r, seq, "0")
                        if src is not None and (r, src[0]) in self._copies:
                            self.dropped[r].add(self._copies[(r, src[0])])   # what it sent
                        sent[(r, peer, _group_seq(group))] = self._resolve(key)
                    elif op.endswith("recv"):
                        found = sent.get((peer, r, _group_seq(group)))
                        if found is not None:
                            self.alias[(r, seq, "0")] = found
                        if ins:
                            at = made.pop(tuple(ins[0].get("shape") or ()), None)
                            if at is not None:
                                self.dropped[r].add(at)
                    continue
                if op in _SENT_COPY and ins:
                    src = producer_of(ins[0])
                    if src is not None:
                        self.alias[(r, seq, "0")] = (r, src[0], src[1])
                        self._copies[(r, seq)] = pos
                if rec.get("kind") == Kind.LEAF and rec.get("leaf") == "input" and r > 0:
                    self.dropped[r].add(pos)
            length = pos + 1
            if first_bwd < 0:
                raise Unsupported(f"rank {self.ranks[r]} recorded no backward")
            spans.append((first_bwd, last_bwd + 1, length))
        if not any_p2p:
            raise Unsupported("no point-to-point send or receive is recorded in it")
        n = len(self.sources)
        self.segments = ([(r, 0, spans[r][0]) for r in range(n)]
                         + [(r, spans[r][0], spans[r][1]) for r in reversed(range(n))]
                         + [(r, spans[r][1], spans[r][2]) for r in range(n)])
        self._number()

    def _resolve(self, key: Key) -> Key:
        seen = 0
        while key in self.alias and seen < 10_000:
            key, seen = self.alias[key], seen + 1
        return key

    def _number(self) -> None:
        """Logical seqs and names over the chained segments."""
        counters: dict[str, int] = {}
        logical = 0
        for r, start, end in self.segments:
            for pos, rec in enumerate(self.sources[r].records()):
                if pos < start or pos >= end or pos in self.dropped[r]:
                    continue
                got = rec.get("seq")
                seq: int = got if isinstance(got, int) else pos
                self.seqs[(r, seq)] = logical
                logical += 1
                name = str(rec.get("name"))
                parsed = RecordName.parse(name)
                if parsed is None:
                    new = name
                elif rec.get("phase") == Phase.BACKWARD and rec.get("forward"):
                    fwd = self.names.get((r, str(rec["forward"])))
                    back = RecordName.parse(fwd) if fwd else None
                    new = RecordName(back.op, Phase.BACKWARD, back.index, back.kind).text \
                        if back is not None and parsed.kind != Kind.PARAM_GRAD else name
                else:
                    idx = counters.get(parsed.op, 0)
                    counters[parsed.op] = idx + 1
                    new = RecordName(parsed.op, parsed.phase, idx, parsed.kind).text
                self.names[(r, name)] = new
                self._origin[new] = r
        self.kept = logical

    # -- DumpSource -----------------------------------------------------------------------------
    @property
    def holds_tensors(self) -> bool:
        return all(s.holds_tensors for s in self.sources)

    def record_count(self) -> int:
        return self.kept

    def stack(self, stack_id: Optional[int]) -> list[dict[str, Any]]:
        if stack_id is None:
            return []
        n = len(self.sources)
        return self.sources[stack_id % n].stack(stack_id // n)

    def tensor_keys(self) -> list[str]:
        return [f"{r}:{k}" for r, s in enumerate(self.sources) for k in s.tensor_keys()]

    def tensor(self, key: str) -> Any:
        r, _, inner = key.partition(":")
        if not r.isdigit() or int(r) >= len(self.sources):
            return None
        return self.sources[int(r)].tensor(inner)

    def records(self) -> Iterator[Record]:
        for r, start, end in self.segments:
            for pos, rec in enumerate(self.sources[r].records()):
                if pos >= end:
                    break
                if pos < start or pos in self.dropped[r]:
                    continue
                yield self._chained(r, pos, rec)

    def rank_of(self, name: str) -> Optional[int]:
        """The rank that ran a logical record."""
        r = self._origin.get(name)
        return self.ranks[r] if r is not None else None

    def _chained(self, r: int, pos: int, rec: Record) -> Record:
        out: Record = copy.deepcopy(rec)
        got = rec.get("seq")
        seq: int = got if isinstance(got, int) else pos
        out["seq"] = self.seqs.get((r, seq), seq)
        for field in ("name", "forward", "reader"):
            value = out.get(field)
            if isinstance(value, str):
                out[field] = self.names.get((r, value), value)
        stack = out.get("stack")
        if isinstance(stack, int):
            out["stack"] = stack * len(self.sources) + r
        for _, _, desc in iter_tensors(out):
            if isinstance(desc.get("key"), str):
                desc["key"] = f"{r}:{desc['key']}"
            src = producer_of(desc)
            if src is not None:
                found = self._resolve((r, src[0], src[1]))
                new = self.seqs.get((found[0], found[1]))
                if new is None:
                    desc.pop("producer", None)
                else:
                    desc["producer"] = producer_ref(new, found[2])
            desc["pieces"] = [{"rank": self.ranks[r], "shape": list(desc.get("shape") or [])}]
            desc["layout"] = f"pipeline stage {r}"
        return out


__all__ = ["ChainedSource"]


def _first_p2p(source: DumpSource) -> tuple[Optional[str], Optional[int]]:
    """(op, peer) of a rank's first recorded point-to-point op, its first send's peer."""
    first: Optional[str] = None
    for rec in source.records():
        if _p2p(rec):
            op = str(rec.get("op"))
            first = first or op
            if op.endswith("send"):
                return first, int(rec["group"]["peer"])
    return first, None


def _stage_order(sources: list[DumpSource]) -> list[DumpSource]:
    """The ranks in the order the batch goes through them, from their sends: stage 0 sends
    before it receives, and each stage's first send goes to the next one (the last stage's
    first send, the gradient, back to one seen already). Rank order where they do not say."""
    by_rank = {int(s.rank if s.rank is not None else i): s for i, s in enumerate(sources)}
    firsts = {rank: _first_p2p(s) for rank, s in by_rank.items()}
    starts = [r for r, (op, _) in firsts.items() if op is not None and op.endswith("send")]
    if len(starts) != 1:
        return sources
    order = [starts[0]]
    while True:
        peer = firsts[order[-1]][1]
        if peer is None or peer in order or peer not in by_rank:
            break
        order.append(peer)
    return [by_rank[r] for r in order] if len(order) == len(sources) else sources


def _group_seq(group: Group) -> int:
    """A collective's sequence number in its process group (-1: not recorded)."""
    return int(group["seq"]) if "seq" in group else -1
