"""`concat:` lines of the mapping file: one fused target module against several golden modules
whose outputs it concatenates (one `qkv_proj` against `q_proj`, `k_proj` and `v_proj`).

    concat:                                        # target name: golden names, in order
      qkv_proj: [q_proj, k_proj, v_proj]           #   joined along the last dim (dim -1)
      gate_up_proj: {golden: [gate_proj, up_proj], dim: -1}

A name is a path segment (joined wherever it stands in a module path, every layer) or a whole
module path. For every target module call it matches, golden's calls of the part modules (the
same path with the name replaced, the same phase and call count) become one golden record named
as the target's call (`join`):

- forward outputs, and in backward the gradients of those outputs, are the parts' concatenated
  along `dim`;
- parameters (on module calls, at their first read, and their gradients) are the parts'
  concatenated along the one dim their shapes add up on ([8, 8] x 3 -> [24, 8]);
- forward inputs are the first part's (the parts read the same input);
- gradients of the inputs (the parts' sum, not a concatenation) are left out, and said.

Statistics are combined exactly: max, min, the mean weighted by element count, the norm as the
root of the sum of squares, nan and inf counts; any other statistic is left out, and said.
Saved tensors are concatenated when they are loaded (`JoinedSource`). The golden ops inside the
part modules move into the joined call, where they meet the target's fused op as a region
(`regions.py`) judged at that call's boundary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Sequence, TYPE_CHECKING, Union

from ..store import statistics
from ..store.records import decoded_stats
from ..store.schema import Descriptor, Kind, Phase, Record, RecordName, Statistics, module_path

if TYPE_CHECKING:
    from ..store.source import DumpSource
    from .mapping import Mapping, Rule

EXACT = tuple(s.key for s in statistics.STATISTICS if s.concat)   # statistics a concatenation keeps
_Role = Literal["inputs", "outputs", "parameters"]
# What of a part's descriptor the joined one has its own of.
_PART_OWN: tuple[Literal["key", "stats", "shape", "producer", "fqn"], ...] = (
    "key", "stats", "shape", "producer", "fqn")


def _in_module(record: Record, module: str) -> Record:
    """The record, moved into another module call."""
    moved = record.copy()
    moved["module"] = module
    return moved
_Join = tuple[Record, list[int], Optional[str], int]   # (joined record, parts, fused call, at)


def _joined_path(path: str, rule: Rule) -> Optional[list[str]]:
    """The golden part paths for a target module path the rule's name stands in, else None."""
    parts, old = path.split("."), rule.old.split(".")
    for k in range(len(parts) - len(old) + 1):
        if parts[k:k + len(old)] == old:
            return [".".join(parts[:k] + p.split(".") + parts[k + len(old):]) for p in rule.parts]
    return None


def _call_key(rec: Record) -> Optional[tuple[str, str, int, str]]:
    """(module path, phase, call count, kind) of a module call or parameter-gradient record."""
    if rec["kind"] not in (Kind.MODULE, Kind.PARAM_GRAD):
        return None
    parsed = RecordName.parse(rec["name"])
    if parsed is None:
        return None
    return module_path(parsed.op), parsed.phase, parsed.index, parsed.kind


def _leaf_key(rec: Record) -> Optional[tuple[str, str, str]]:
    """(module path, parameter name, leaf kind) of a parameter's or buffer's first read."""
    if rec["kind"] != Kind.LEAF or rec.get("leaf") not in ("parameter", "buffer"):
        return None
    fqn = str(rec.get("tensor") or "")
    if "." not in fqn:
        return None
    path, name = fqn.rsplit(".", 1)
    return path, name, str(rec.get("leaf"))


class Joiner:
    """Builds the joined golden records of one mapping for one pair of dumps (see `join`)."""

    def __init__(self, mapping: Mapping, used: set[int]) -> None:
        self.mapping, self.used = mapping, used
        self.keys: dict[str, tuple[int, tuple[str, ...]]] = {}    # joined key -> (dim, parts)
        self.notes: dict[tuple[int, str], str] = {}

    def join(self, view: list[Record], golden: list[Record]) -> list[Record]:
        """Golden with each fused target call's parts replaced by one joined record."""
        from .mapping import MappingError

        rules = [r for r in self.mapping.rules if r.kind == "concat"]
        if not rules:
            return golden
        calls = {c: j for j, g in enumerate(golden) if (c := _call_key(g)) is not None}
        leaves = {lk: j for j, g in enumerate(golden) if (lk := _leaf_key(g)) is not None}
        golden_paths = {k[0] for k in calls} | {k[0] for k in leaves}
        target_paths = {k[0] for t in view if (k := _call_key(t)) is not None}
        for rule in rules:
            joinable = [jp for p in target_paths if (jp := _joined_path(p, rule)) is not None]
            if not joinable:
                raise MappingError(f"{self.mapping.where(rule)}: {rule.old!r} names no module "
                                   f"of the target dump; check the spelling against the "
                                   f"report's names")
            for i, part in enumerate(rule.parts):
                if not any(paths[i] in golden_paths for paths in joinable):
                    raise MappingError(f"{self.mapping.where(rule)}: {part!r} names no module "
                                       f"of the golden dump where {rule.old!r} stands in the "
                                       f"target's; check the spelling against the report's names")
        joins: list[_Join] = []
        taken: set[int] = set()
        parent: dict[str, str] = {}         # a part's call (either phase) -> the joined call's
        for at, t in enumerate(view):
            call, leaf = _call_key(t), _leaf_key(t)
            path = call[0] if call else leaf[0] if leaf else None
            if path is None:
                continue
            for rule in rules:
                paths = _joined_path(path, rule)
                if paths is None:
                    continue
                found = [calls.get((p,) + call[1:]) for p in paths] if call else \
                    [leaves.get((p,) + leaf[1:]) for p in paths] if leaf else []
                index = [j for j in found if j is not None]
                if len(index) < len(found) or taken.intersection(index):
                    continue
                parts = [golden[j] for j in index]
                fused = None
                if call is not None:
                    parsed = RecordName.parse(t["name"])
                    fused = parsed.with_phase(Phase.FORWARD).text if parsed else None
                    if call[3] == Kind.MODULE:
                        parent.update((g["name"], t["name"]) for g in parts)
                joins.append((self._record(t, parts, rule), index, fused, at))
                taken.update(index)
                self.used.add(rule.line)
                break
        return self._placed(golden, joins, taken, parent, _first_inside(view, joins))

    def _placed(self, golden: list[Record], joins: list[_Join], taken: set[int],
                parent: dict[str, str], inside: dict[tuple[str, str], int]) -> list[Record]:
        """Golden with the joined records in place of their parts. The golden ops inside the
        parts of one fused call move next to it, in the order the target has the fused call's
        records and its ops (`inside`: where its first op is), so that they meet the fused op
        alone and the ops between the parts (q's view and transpose before k_proj runs) pair
        with the target's after it."""
        modules = {g["name"]: g["module"] for g in golden if g["kind"] == Kind.MODULE}
        fused_of = {p: RecordName.parse(n).with_phase(Phase.FORWARD).text     # type: ignore[union-attr]
                    for p, n in parent.items() if RecordName.parse(n) is not None}

        def owner(rec: Record) -> Optional[str]:
            m, seen = rec["module"], 0
            while m and seen < 64:
                if m in fused_of:
                    return fused_of[m]
                m, seen = modules.get(m), seen + 1
            return None

        groups: dict[tuple[str, str], list[tuple[int, int, Record]]] = {}
        slots: dict[int, list[Record]] = {}
        for rec, index, fused, at in joins:
            if fused is None:               # a parameter's first read: where the first part's was
                slots[min(index)] = [rec]
                continue
            groups.setdefault((fused, rec["phase"]), []).append(
                (min(index) if rec["phase"] == Phase.FORWARD else max(index), at, rec))
        inner: dict[tuple[str, str], list[int]] = {}
        for j, g in enumerate(golden):
            if j in taken or g["kind"] in (Kind.LEAF, Kind.PARAM_GRAD):
                continue
            fused = owner(g)
            if fused is not None and (fused, g["phase"]) in groups:
                inner.setdefault((fused, g["phase"]), []).append(j)
        moved: set[int] = set()
        for key, joined in groups.items():
            ops = inner.get(key, [])
            moved.update(ops)
            first = inside.get(key, -1)
            run = sorted([(at, 0, rec) for _, at, rec in joined] +
                         [(first, k + 1, golden[j]) for k, j in enumerate(ops)],
                         key=lambda e: (e[0], e[1]))
            # forward, the fused op runs as soon as its input is there, with the first part;
            # backward, once the gradient of every part's output is, with the last
            spots = [i for i, _, _ in joined] + ops
            slots[min(spots) if key[1] == Phase.FORWARD else max(spots)] = [r for _, _, r in run]
        out: list[Record] = []
        for j, g in enumerate(golden):
            for rec in slots.get(j, ()):
                to = parent.get(str(rec["module"] or ""))
                out.append(_in_module(rec, to) if to else rec)
            if j in taken or j in moved:
                continue
            to = parent.get(str(g["module"] or ""))
            out.append(_in_module(g, to) if to else g)
        return out

    def _record(self, target: Record, parts: list[Record], rule: Rule) -> Record:
        """The joined golden record: the target's names, the parts' tensors joined."""
        joined = target.copy()
        joined["stack"] = parts[0]["stack"]
        joined["seq"] = parts[0]["seq"]
        backward = target["phase"] == Phase.BACKWARD and target["kind"] == Kind.MODULE
        # (`complete` made inputs and outputs lists, parameters an object)
        joined["inputs"] = [self._slot("inputs", backward, i, d, parts, rule, target)
                            for i, d in enumerate(target["inputs"])]
        joined["outputs"] = [self._slot("outputs", backward, i, d, parts, rule, target)
                             for i, d in enumerate(target["outputs"])]
        joined["parameters"] = {k: self._slot("parameters", backward, k, d, parts, rule, target)
                                for k, d in target["parameters"].items()}
        return joined

    def _slot(self, role: _Role, backward: bool, at: Union[int, str], desc: Descriptor,
              parts: list[Record], rule: Rule, target: Record) -> Descriptor:
        none: Descriptor = {"type": "none"}
        if not isinstance(desc, dict) or desc.get("type") != "tensor":
            return desc
        found: list[Descriptor] = []
        for p in parts:
            slots = p[role]
            d = (slots.get(at) if isinstance(slots, dict) and isinstance(at, str) else
                 slots[at] if isinstance(slots, list) and isinstance(at, int) and at < len(slots)
                 else None)
            if not isinstance(d, dict) or d.get("type") != "tensor" or d.get("shape") is None:
                return none
            found.append(d)
        shape = list(desc.get("shape") or [])
        if role == "parameters" or target["kind"] == Kind.LEAF:
            dim = _adding_dim(shape, [list(d["shape"]) for d in found])
            if dim is None:
                self._say(rule, f"the parameter {at!r} of the parts does not add up to the "
                                f"target's {shape} along one dim: not compared")
                return none
            return self._joined(desc, found, dim, rule)
        if role == "inputs" and not backward:          # the parts read the same input
            return found[0] if all(list(d["shape"]) == shape for d in found) else none
        if role == "outputs" and backward:
            self._say(rule, "the gradients of the parts' inputs are their sum, not a "
                            "concatenation: not compared")
            return none
        rank = len(shape)
        dim = rule.dim + rank if rule.dim < 0 else rule.dim
        shapes = [list(d["shape"]) for d in found]
        if not 0 <= dim < rank or _adding_dim(shape, shapes) != dim:
            from .mapping import MappingError
            raise MappingError(
                f"{self.mapping.where(rule)}: the outputs of {', '.join(rule.parts)} "
                f"({', '.join(str(s) for s in shapes)}) do not concatenate along dim {rule.dim} "
                f"into the target's {shape} ({target.get('name')}); give the dim they join on")
        return self._joined(desc, found, dim, rule)

    def _joined(self, target_desc: Descriptor, parts: list[Descriptor], dim: int,
                rule: Rule) -> Descriptor:
        out = parts[0].copy()
        for own in _PART_OWN:
            out.pop(own, None)
        out["shape"] = list(target_desc.get("shape") or [])
        if "fqn" in target_desc:
            out["fqn"] = target_desc["fqn"]
        dropped: set[str] = set()
        stats = join_stats([decoded_stats(p) for p in parts],
                           [_numel(p.get("shape")) for p in parts], dropped)
        if stats is not None:
            out["stats"] = stats
        if dropped:
            self._say(rule, f"statistics {', '.join(sorted(dropped))} cannot be combined from "
                            f"the parts' and were left out")
        keys = [p.get("key") for p in parts]
        if all(isinstance(k, str) and k for k in keys):
            key = f"concat({dim}):" + "|".join(str(k) for k in keys)
            self.keys[key] = (dim, tuple(str(k) for k in keys))
            out["key"] = key
        return out

    def _say(self, rule: Rule, what: str) -> None:
        self.notes.setdefault((rule.line, what), f"mapping {self.mapping.where(rule)} "
                                                 f"({rule.text}): {what}")


def _first_inside(view: list[Record], joins: list[_Join]) -> dict[tuple[str, str], int]:
    """(fused call, phase) -> where the target's first op inside that call is (`view` index)."""
    fused = {f for _, _, f, _ in joins if f is not None}
    modules = {t["name"]: t["module"] for t in view if t["kind"] == Kind.MODULE}
    out: dict[tuple[str, str], int] = {}
    for at, t in enumerate(view):
        if t["kind"] in (Kind.MODULE, Kind.LEAF, Kind.PARAM_GRAD):
            continue
        m, seen = t["module"], 0
        while m and seen < 64 and m not in fused:
            m, seen = modules.get(m), seen + 1
        if m in fused:
            out.setdefault((str(m), t["phase"]), at)
    return out


def _numel(shape: Optional[Sequence[int]]) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n


def _adding_dim(target: list[int], parts: list[list[int]]) -> Optional[int]:
    """The one dim along which `parts` concatenate into `target`, or None."""
    for d in range(len(target)):
        if all(len(p) == len(target) and p[:d] + p[d + 1:] == target[:d] + target[d + 1:]
               for p in parts) and sum(p[d] for p in parts) == target[d]:
            return d
    return None


def join_stats(stats: list[dict[str, Any]], numels: list[int], dropped: set[str]
               ) -> Optional[Statistics]:
    """The statistics of the concatenation of tensors with `stats` and `numels`, exact where
    they can be (EXACT); the names of the others go into `dropped`. None when a part has none."""
    if not stats or any(not s for s in stats):
        return None
    pieces = [statistics.Piece(s, n) for s, n in zip(stats, numels)]
    # (`merge` spells them as a descriptor holds them)
    return statistics.merge(pieces, statistics.CONCAT, dropped)


class JoinedSource:
    """The golden dump with the joined records' tensors: `tensor(key)` of a joined key loads
    the parts and concatenates them; everything else is the dump's own."""

    def __init__(self, inner: DumpSource, keys: dict[str, tuple[int, tuple[str, ...]]]) -> None:
        self.inner, self.keys = inner, keys
        self.path: Path = inner.path
        self.meta: dict[str, Any] = inner.meta
        self.step, self.rank, self.format = inner.step, inner.rank, inner.format

    def records(self) -> Iterator[Record]:
        return self.inner.records()

    def tensor(self, key: str) -> Any:
        spec = self.keys.get(key)
        if spec is None:
            return self.inner.tensor(key)
        import torch

        loaded = [self.inner.tensor(k) for k in spec[1]]
        if any(t is None for t in loaded):
            return None
        return torch.cat(loaded, spec[0])

    def tensor_keys(self) -> list[str]:
        return self.inner.tensor_keys() + list(self.keys)

    def stack(self, stack_id: Optional[int]) -> list[dict[str, Any]]:
        return self.inner.stack(stack_id)

    @property
    def holds_tensors(self) -> bool:
        return self.inner.holds_tensors

    def record_count(self) -> int:
        return self.inner.record_count()


__all__ = ["Joiner", "JoinedSource", "join_stats", "EXACT"]
