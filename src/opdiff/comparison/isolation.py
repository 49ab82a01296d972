"""Same-input isolation: each op and module call of the target re-run on golden's recorded
inputs, in the target's dtypes, and its output set against golden's: "bitwise equal", "within
the dtype's rounding" (1 unit in the last place at most) or "differs".

This is the table people make by hand when two implementations of one model (a trainer and an
inference engine) give different log-probabilities for the same tokens: feed both sides the same
inputs, op by op, and count which ops agree bit for bit. Fed the same inputs, every unit that
computes alike is bitwise equal; what is left names the implementation difference itself (a
bf16 cast before the RMSNorm's weight multiply instead of after), not the error it spreads::

    from opdiff.comparison.isolation import isolate
    table = isolate("./dump/engine", "./dump/trainer")     # target, golden (task="tensor")
    print(table.text())          # one row per unit, then the summary
    table.named                  # the innermost units that are not bitwise equal

A unit is an op (paired with golden's op at the same place: its module call, its op, how many
calls of that op the module call made before it) or a module call (paired by its path and call
number, whatever its class is called): the target's ops inside it run as one chain
(`replay.chainrun`), the module call's inputs and parameters taken from golden. A unit whose
ops cannot be replayed, or whose inputs have no counterpart on golden's side, is "not replayed"
with the reason: never counted as equal. Comparison is in the less precise of the two output
dtypes (a float32 product against golden's bfloat16 one: in bfloat16). Where golden's inputs
are bitwise the target's own, the target's recorded outputs are judged as they are (what its own
kernels made of them: a faulty kernel shows there, where a CPU replay would not).
"""
from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ..errors import OpdiffError
from ..store.records import iter_tensors, producer_of
from ..store.schema import Descriptor, Kind, Record, Role
from ..store.source import DumpSource

if TYPE_CHECKING:
    import torch

EQUAL, ROUNDING, DIFFERS, NOT_REPLAYED = "bitwise equal", "within the dtype's rounding", \
    "differs", "not replayed"


@dataclass(frozen=True)
class Unit:
    """One row of the table: the target's unit, golden's, what kind it is (a module's class or
    an op), the verdict, the share of output elements bitwise equal and the largest difference
    in units in the last place of the compared dtype."""
    target: str
    golden: str
    kind: str
    verdict: str
    equal: float = 0.0
    ulps: float = 0.0
    why: str = ""
    inside: tuple[str, ...] = ()        # the target units it holds (a module call's)


@dataclass
class IsolationTable:
    units: list[Unit] = field(default_factory=list)

    @property
    def named(self) -> list[Unit]:
        """The units fed the same inputs that are not bitwise equal while every unit inside them
        is (or that hold none): where the two implementations compute otherwise."""
        judged = {u.target: u for u in self.units}
        return [u for u in self.units if u.verdict in (ROUNDING, DIFFERS) and not any(
            judged[i].verdict in (ROUNDING, DIFFERS) for i in u.inside if i in judged)]

    def summary(self) -> str:
        """How many units of each kind are bitwise equal, the named ones first."""
        total: Counter[str] = Counter(u.kind for u in self.units)
        equal: Counter[str] = Counter(u.kind for u in self.units if u.verdict == EQUAL)
        named = {u.kind for u in self.named}
        kinds = sorted(total, key=lambda k: (k not in named, equal[k] / total[k], k))
        said = "; ".join(f"{k} {equal[k]}/{total[k]}" for k in kinds)
        head = ("not bitwise equal fed the same inputs: " + ", ".join(
            f"{u.target} ({u.equal:.0%} of its elements equal, {u.ulps:.3g} ulps at most)"
            for u in self.named)
                if self.named else "every replayed unit is bitwise equal fed the same inputs")
        return f"same-input isolation: {head}. Bitwise equal per kind: {said}"

    def text(self, named: bool = False) -> str:
        """The table (named: only the named units' rows), then the summary."""
        lines = [f"{'unit':60} {'verdict':28} {'equal':>7} {'ulps':>6}"]
        for u in (self.named if named else self.units):
            lines.append(f"{u.target[:60]:60} {u.verdict:28} {u.equal:7.1%} {u.ulps:6.3g}"
                         + (f"  ({u.why})" if u.why else ""))
        return "\n".join(lines + ["", self.summary()])


def _open(path: Union[str, os.PathLike[str]]) -> DumpSource:
    from ..store.reader import open_dump

    p = Path(path)
    if not (p / "records.jsonl").exists():
        found = sorted(p.glob("step*/rank*"))
        if not found:
            raise OpdiffError(f"{p}: not an opdiff dump (no step*/rank* directory)")
        p = found[0]
    return open_dump(p)


def _path(record: Record) -> str:
    """A module call's path and call number, its class left out (a re-implementation's own)."""
    op = str(record["op"])
    return f"{op.rsplit('.', 1)[0]}#{record['name'].rsplit('.', 1)[-1]}"


def _places(records: list[Record]) -> dict[tuple[str, str, int], Record]:
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for r in records:
        if r["kind"] not in Kind.REPLAYABLE or r["phase"] != "forward":
            continue
        at = (str(r.get("module") or ""), str(r["op"]))
        seen[at] = seen.get(at, -1) + 1
        out[(at[0], at[1], seen[at])] = r
    return out


def _tensors(record: Record, role: str) -> list[Descriptor]:
    return [d for _, r, d in iter_tensors(record) if r == role]


class _Side:
    """One dump's records, who made each saved tensor, and each module call's members."""

    def __init__(self, dump: DumpSource) -> None:
        self.dump = dump
        self.records = [r for r in dump.records() if r["phase"] == "forward"]
        # (its own index, not a pair's `graph.RunGraph`: forward records only, of one dump)
        self.by_seq = {r["seq"]: r for r in self.records if isinstance(r.get("seq"), int)}
        self.parent = {r["name"]: r.get("module") for r in self.records if r["kind"] == Kind.MODULE}
        self.params = {d.get("fqn"): d for r in self.records for d in _tensors(r, Role.OUTPUT)
                       if r["kind"] == Kind.LEAF and d.get("fqn") and d.get("key")} | {
            str(r["op"]).split(".", 1)[-1]: d for r in self.records
            if r["kind"] == Kind.LEAF and r.get("leaf") in ("parameter", "buffer")
            for d in _tensors(r, Role.OUTPUT) if d.get("key")}
        self.members: dict[str, list[Record]] = defaultdict(list)
        for r in self.records:
            if r["kind"] in Kind.REPLAYABLE:
                at = r.get("module")
                while at:
                    self.members[at].append(r)
                    at = self.parent.get(at)

    def load(self, key: str) -> Any:
        return self.dump.tensor(key)


def _golden_input(t_desc: Descriptor, t: _Side, g: _Side, g_by_name: dict[str, Record],
                  boundary: dict[str, Descriptor]) -> Optional[Descriptor]:
    """Golden's counterpart of a target input made outside the unit: the unit's own input at
    the same position, the parameter of the same name, or the same-named producer's output."""
    key = t_desc.get("key")
    if key in boundary:
        return boundary[key]
    fqn = t_desc.get("fqn")
    if t_desc.get("leaf") in ("parameter", "buffer") and fqn in g.params:
        found: Descriptor = g.params[fqn]
        return found
    producer = producer_of(t_desc)
    if producer is not None and producer[0] in t.by_seq:
        made = t.by_seq[producer[0]]
        if made["kind"] == Kind.LEAF and made.get("leaf") in ("parameter", "buffer"):
            param: Optional[Descriptor] = g.params.get(str(made["op"]).split(".", 1)[-1])
            return param
        other = g_by_name.get(made["name"])
        if other is not None:
            outs = {n[len(other["name"]) + len(".output."):]: d for n, r, d in iter_tensors(other)
                    if r == Role.OUTPUT}
            return outs.get(str(producer[1]))
    return None


def _same(a: torch.Tensor, b: Optional[torch.Tensor]) -> bool:
    import torch

    return b is not None and a.dtype == b.dtype and a.shape == b.shape and \
        bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                   and torch.equal(a.nan_to_num(), b.nan_to_num())))


def _judge(out: torch.Tensor, gold: torch.Tensor) -> tuple[str, float, float]:
    import torch

    if out.shape != gold.shape:
        return DIFFERS, 0.0, math.inf
    if not (out.is_floating_point() and gold.is_floating_point()):
        same = out.eq(gold.to(out.dtype))
        share = float(same.double().mean()) if same.numel() else 1.0
        return (EQUAL if share == 1.0 else DIFFERS), share, 0.0 if share == 1.0 else math.inf
    low = out.dtype if torch.finfo(out.dtype).eps >= torch.finfo(gold.dtype).eps else gold.dtype
    a, b = out.to(low), gold.to(low)
    same = (a == b) | (a.isnan() & b.isnan())
    share = float(same.double().mean()) if same.numel() else 1.0
    if share == 1.0:
        return EQUAL, 1.0, 0.0
    spacing = torch.nextafter(b.abs(), torch.full_like(b, math.inf)) - b.abs()
    ulps = float(((a.double() - b.double()).abs() / spacing.double().clamp_min(1e-300))
                 .nan_to_num(math.inf).amax())
    return (ROUNDING if ulps <= 1.0 else DIFFERS), share, ulps


def _run(unit: Record, g_unit: Record, members: list[Record], t: _Side, g: _Side,
         g_by_name: dict[str, Record]) -> tuple[str, float, float, str]:
    """(verdict, share equal, ulps, why) of the target's `members` fed golden's inputs."""
    import torch

    from .replay.calls import NotReplayable
    from .replay.chainrun import output_slots, refusal, run_chain
    from .replay.local import one_thread

    why = refusal(members)
    if why:
        return NOT_REPLAYED, 0.0, 0.0, why
    t_in, g_in = _tensors(unit, Role.INPUT), _tensors(g_unit, Role.INPUT)
    boundary = {str(d.get("key")): gd for d, gd in zip(t_in, g_in) if d.get("key")} \
        if len(t_in) == len(g_in) else {}
    inside = {m["seq"] for m in members}
    fed: dict[str, Any] = {}
    for m in members:
        for name, role, desc in iter_tensors(m):
            producer = producer_of(desc) if role == Role.INPUT else None
            if role != Role.INPUT or not desc.get("key") or \
                    (producer is not None and producer[0] in inside):
                continue
            gd = _golden_input(desc, t, g, g_by_name, boundary)
            if gd is None or not gd.get("key"):
                return NOT_REPLAYED, 0.0, 0.0, f"{name} has no counterpart in golden's dump"
            value = g.load(gd["key"])
            if value is None or list(value.shape) != list(desc.get("shape") or value.shape):
                return NOT_REPLAYED, 0.0, 0.0, f"golden's tensor for {name} is not saved " \
                    "or has another shape"
            dtype = getattr(torch, str(desc.get("dtype", "")).replace("torch.", ""), None)
            fed[str(desc["key"])] = value.to(dtype) if isinstance(dtype, torch.dtype) else value
    made = {str(d.get("key")): n for m in members for (n, _), d in
            zip(output_slots(m), _tensors(m, Role.OUTPUT)) if d.get("key")}
    t_out, g_out = _tensors(unit, Role.OUTPUT), _tensors(g_unit, Role.OUTPUT)
    wanted = [made.get(str(d.get("key"))) for d in t_out]
    if not t_out or len(t_out) != len(g_out) or None in wanted:
        return NOT_REPLAYED, 0.0, 0.0, "its outputs are not made by its recorded ops"
    if all(_same(value, t.load(key)) for key, value in fed.items()):
        # golden's inputs are the target's own: its recorded outputs are what its own kernels
        # made of them (a kernel's fault shows there, not in a CPU replay)
        values = {str(w): t.load(str(d["key"])) for w, d in zip(wanted, t_out)}
    else:
        try:
            with one_thread():
                values, _ = run_chain(members, lambda k: fed[k] if k in fed else t.load(k),
                                      None, [w for w in wanted if w])
        except (NotReplayable, Exception) as exc:    # (a unit that cannot run says why)
            return NOT_REPLAYED, 0.0, 0.0, str(exc)[:120]
    verdicts = []
    for w, gd in zip(wanted, g_out):
        gold = g.load(gd["key"]) if gd.get("key") else None
        if gold is None:
            return NOT_REPLAYED, 0.0, 0.0, "golden's output is not saved"
        verdicts.append(_judge(values[str(w)], gold))
    order = (EQUAL, ROUNDING, DIFFERS)
    worst = max(verdicts, key=lambda v: order.index(v[0]))
    return worst[0], min(v[1] for v in verdicts), max(v[2] for v in verdicts), ""


def isolate(target: Union[str, os.PathLike[str]], golden: Union[str, os.PathLike[str]],
            progress: Callable[[str], None] = lambda s: None
            ) -> IsolationTable:
    """The same-input isolation table of two tensor dumps (a run directory or one step/rank
    directory each; see the module docstring)."""
    t, g = _Side(_open(target)), _Side(_open(golden))
    for side, name in ((t, "target"), (g, "golden")):
        if not any(d.get("key") for r in side.records for _, _, d in iter_tensors(r)):
            raise OpdiffError(f"{side.dump.path}: the {name} dump saved no tensors; same-input "
                              f"isolation feeds ops recorded inputs: record with task=\"tensor\"")
    g_by_name = {r["name"]: r for r in g.records}
    g_modules = {_path(r): r for r in g.records if r["kind"] == Kind.MODULE}
    g_places = _places(g.records)
    table = IsolationTable()
    for at, rec in _places(t.records).items():
        other = g_places.get(at)
        if other is None:
            continue
        progress(rec["name"])
        verdict, share, ulps, why = _run(rec, other, [rec], t, g, g_by_name)
        table.units.append(Unit(rec["name"], other["name"], str(rec["op"]), verdict, share,
                                ulps, why))
    ops_of = {u.target for u in table.units}
    for rec in t.records:
        other = g_modules.get(_path(rec)) if rec["kind"] == Kind.MODULE else None
        if other is None:
            continue
        progress(rec["name"])
        members = t.members.get(rec["name"], [])
        held = tuple(m["name"] for m in members if m["name"] in ops_of) + tuple(
            n for n, p in t.parent.items() if p == rec["name"])
        verdict, share, ulps, why = _run(rec, other, members, t, g, g_by_name)
        table.units.append(Unit(rec["name"], other["name"], str(rec["op"]).rsplit(".", 1)[-1],
                                verdict, share, ulps, why, held))
    if not table.units:
        raise OpdiffError("no op or module call of the target pairs with golden's: are both "
                          "dumps of one model, recorded with task=\"tensor\"?")
    return table


__all__ = ["isolate", "IsolationTable", "Unit", "EQUAL", "ROUNDING", "DIFFERS", "NOT_REPLAYED"]
