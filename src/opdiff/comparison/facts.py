"""What a plan decided of one step/rank pair that the judge needs besides the rows: one typed
object, saved in summary.json ("facts", `schemas/compare-summary.schema.json`) so that
`rejudge` judges with what the compare decided, not with what it can guess from the rows.

    facts = PairFacts(step=0, rank=0, withheld=("model.norm.weight.param_grad.0",))
    PairFacts.from_json(facts.to_json()) == facts

- `withheld`: records blame never names (the parameter gradients of a compiled backward that
  is not recorded: `compiled_backward.withheld`);
- `exposed`: judged module calls of compiled code that unjudged compiled code ran before, not
  named where their input already differs in statistics (`compiled_inputs.exposed`, applied by
  `judgement.not_named`);
- `regions`: each region judged through its boundary (`RegionFacts`: which rows measured its
  inputs and outputs, how its ops read them, what it made, its module call);
- `forced`: the mapping file's forced pairs judged with inputs measured elsewhere, or not judged
  on their own (`ForcedFacts`, `forced.py`).

Rows are named by their target tensor (`TensorRow.target_name`), unique among a pair's
measured rows. Results written before summary.json held these kept them as row marks
(`TensorRow.boundary`): `from_marks` reads those, the one place that does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from .result import TensorRow

Reader = tuple[str, str, str, str]      # (tensor measured, the region's op reading it, its argument, FQN)


def region_label(number: int, where: str) -> str:
    """What a region's rows carry as `TensorRow.region`: "region 2 in model.layers.0.self_attn"."""
    return f"region {number}" + (f" in {where}" if where else "")


@dataclass(frozen=True)
class RegionFacts:
    """One region judged as one op through its boundary (`regions.py`), as the compare judged it."""
    number: int
    phase: str
    where: str = ""                 # its module path ("": the root, or not known)
    how: str = ""                   # how its boundary was proven: "dataflow" | "module" ("": older file)
    position: Optional[int] = None  # its place in the alignment (None: its first row's, older file)
    inputs: tuple[str, ...] = ()    # the rows its entering tensors were measured by, as judged
    outputs: tuple[str, ...] = ()   # ... its leaving tensors (where a paired op reads them)
    readers: tuple[Reader, ...] = ()    # how its ops read the entering tensors (dataflow only)
    made: tuple[tuple[str, str], ...] = ()   # (output row, the tensor the region made)
    module: Optional[str] = None    # the innermost module call holding its target ops
    unpaired: tuple[str, ...] = ()  # its parameters without a golden partner (not compared)
    through: tuple[str, ...] = ()   # other regions' ops whose results it was judged through

    @property
    def name(self) -> str:
        return f"Region.{self.number}.{self.phase}"

    @property
    def label(self) -> str:
        return region_label(self.number, self.where)

    def to_json(self) -> dict[str, object]:
        return {"number": self.number, "phase": self.phase, "where": self.where, "how": self.how,
                "position": self.position, "inputs": list(self.inputs),
                "outputs": list(self.outputs), "readers": [list(r) for r in self.readers],
                "made": [list(m) for m in self.made], "module": self.module,
                "unpaired": list(self.unpaired), "through": list(self.through)}

    @classmethod
    def from_json(cls, data: object) -> Optional["RegionFacts"]:
        if not isinstance(data, Mapping):
            return None
        number, phase, position = data.get("number"), data.get("phase"), data.get("position")
        texts = [data.get(k, "") for k in ("where", "how")]
        lists = [data.get(k, []) for k in ("inputs", "outputs", "unpaired", "through")]
        readers, made, module = data.get("readers", []), data.get("made", []), data.get("module")
        if not (isinstance(number, int) and not isinstance(number, bool)
                and isinstance(phase, str) and (position is None or _int(position))
                and all(isinstance(t, str) for t in texts) and all(map(_strings, lists))
                and (module is None or isinstance(module, str))
                and isinstance(readers, list) and all(_strings(r, 4) for r in readers)
                and isinstance(made, list) and all(_strings(m, 2) for m in made)):
            return None
        return cls(number, phase, texts[0], texts[1], position, tuple(lists[0]),
                   tuple(lists[1]), tuple((r[0], r[1], r[2], r[3]) for r in readers),
                   tuple((m[0], m[1]) for m in made), module, tuple(lists[2]), tuple(lists[3]))


@dataclass(frozen=True)
class ForcedFacts:
    """A forced pair of the mapping file (`forced.py`) judged otherwise than by its own rows:
    with `inputs` it did not measure, taken where the target made them, or, where one could
    not be found there, not judged on its own (`unjudged`: its output rows)."""
    name: str
    inputs: tuple[str, ...] = ()
    unjudged: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "inputs": list(self.inputs), "unjudged": list(self.unjudged)}

    @classmethod
    def from_json(cls, data: object) -> Optional["ForcedFacts"]:
        if not isinstance(data, Mapping):
            return None
        name, lists = data.get("name"), [data.get(k, []) for k in ("inputs", "unjudged")]
        if not isinstance(name, str) or not all(map(_strings, lists)):
            return None
        return cls(name, tuple(lists[0]), tuple(lists[1]))


@dataclass(frozen=True)
class PairFacts:
    """One pair's decisions (records by name, sorted: the file is stable)."""
    step: Optional[int] = None
    rank: Optional[int] = None
    withheld: tuple[str, ...] = ()
    exposed: tuple[str, ...] = ()
    regions: tuple[RegionFacts, ...] = ()
    forced: tuple[ForcedFacts, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.withheld or self.exposed or self.regions or self.forced)

    @classmethod
    def of(cls, step: Optional[int], rank: Optional[int], withheld: Iterable[str] = (),
           exposed: Iterable[str] = (), regions: Iterable[RegionFacts] = (),
           forced: Iterable[ForcedFacts] = ()) -> "PairFacts":
        return cls(step, rank, tuple(sorted(set(withheld))), tuple(sorted(set(exposed))),
                   tuple(sorted(regions, key=lambda r: r.number)), tuple(forced))

    def at(self, step: Optional[int], rank: Optional[int]) -> "PairFacts":
        return PairFacts(step, rank, self.withheld, self.exposed, self.regions, self.forced)

    def with_units(self, regions: Iterable[RegionFacts], forced: Iterable[ForcedFacts]
                   ) -> "PairFacts":
        """These facts with the regions and forced pairs judged besides."""
        return PairFacts.of(self.step, self.rank, self.withheld, self.exposed,
                            [*self.regions, *regions], [*self.forced, *forced])

    def unjudged_rows(self) -> set[str]:
        """The output rows of forced pairs not judged on their own."""
        return {name for f in self.forced for name in f.unjudged}

    def to_json(self) -> dict[str, object]:
        return {"step": self.step, "rank": self.rank, "withheld": list(self.withheld),
                "exposed": list(self.exposed), "regions": [r.to_json() for r in self.regions],
                "forced": [f.to_json() for f in self.forced]}

    @classmethod
    def from_json(cls, data: object) -> Optional["PairFacts"]:
        """The facts a summary.json entry holds; None for an entry that is not one (a file is
        untrusted: a wrong entry is ignored, as if the compare had decided nothing)."""
        if not isinstance(data, Mapping):
            return None
        step, rank = data.get("step"), data.get("rank")
        names = [data.get("withheld", []), data.get("exposed", [])]
        if not all(v is None or _int(v) for v in (step, rank)) or not all(map(_strings, names)):
            return None
        units = [data.get("regions", []), data.get("forced", [])]
        if not all(isinstance(u, list) for u in units):
            return None
        regions = [RegionFacts.from_json(r) for r in units[0]]
        forced = [ForcedFacts.from_json(f) for f in units[1]]
        if any(r is None for r in regions) or any(f is None for f in forced):
            return None
        return cls.of(step, rank, names[0], names[1], [r for r in regions if r is not None],
                      [f for f in forced if f is not None])

    @classmethod
    def from_marks(cls, rows: Sequence[TensorRow], step: Optional[int] = None,
                   rank: Optional[int] = None) -> "PairFacts":
        """The shim for results written before these facts were saved: their rows' marks
        (`TensorRow.boundary`), read here and nowhere else. The marks were:

            withheld:<record>, exposed:<record>          (on any row of the record)
            in:<forced op>, unjudged:<forced op>         (forced.py: an input measured
                                                          elsewhere, an output not judged)
            in:Region.2.forward, out:Region.2.forward    (a region's boundary rows)
            reads:Region.2.forward:["<op>", "<argument>", "<fqn>"]
            made:Region.2.forward:<tensor>
            module:Region.2.forward:<module call>        (these three once per region,
            unpaired:Region.2.forward:["<fqn>", ...]      on its first boundary row)
            through:Region.2.forward:["<record>", ...]

        (`in` names a forced op or a region: a region's name is `Region.<n>.<phase>`.)"""
        found: dict[str, set[str]] = {"withheld": set(), "exposed": set()}
        forced: dict[str, dict[str, list[str]]] = {}
        regions: dict[int, _OldRegion] = {}
        places = _old_places(rows)
        for row in rows:
            name = row.target_name or ""
            for mark in row.boundary:
                kind, _, rest = mark.partition(":")
                unit, _, value = rest.partition(":")
                number = _region_number(unit)
                if kind in found and rest:
                    found[kind].add(rest)
                elif number is None and kind in ("in", "unjudged") and rest:
                    forced.setdefault(rest, {"in": [], "unjudged": []})[kind].append(name)
                elif number is not None and number in places:
                    regions.setdefault(number, _OldRegion(unit.split(".")[2])).read(
                        kind, name, value)
        return cls.of(step, rank, found["withheld"], found["exposed"],
                      [r.facts(n, places[n]) for n, r in regions.items()],
                      [ForcedFacts(op, tuple(lists["in"]), tuple(lists["unjudged"]))
                       for op, lists in forced.items()])

    def __or__(self, other: "PairFacts") -> "PairFacts":
        """Both facts (a file's saved facts and its rows' old marks)."""
        return PairFacts.of(self.step, self.rank, [*self.withheld, *other.withheld],
                            [*self.exposed, *other.exposed], [*self.regions, *other.regions],
                            [*self.forced, *other.forced])


@dataclass
class _OldRegion:
    """A region's facts as its old marks give them (`PairFacts.from_marks`)."""
    phase: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    readers: list[Reader] = field(default_factory=list)
    made: list[tuple[str, str]] = field(default_factory=list)
    module: Optional[str] = None
    unpaired: list[str] = field(default_factory=list)
    through: list[str] = field(default_factory=list)

    def read(self, kind: str, row: str, value: str) -> None:
        """One mark on `row` (an untrusted mark is ignored)."""
        if kind in ("in", "out") and row:
            (self.inputs if kind == "in" else self.outputs).append(row)
        elif kind == "reads" and row:
            reader = _parsed(value, 3)
            if reader is not None:
                self.readers.append((row, reader[0], reader[1], reader[2]))
        elif kind == "made" and row and value:
            self.made.append((row, value))
        elif kind == "module" and value:
            self.module = value
        elif kind == "unpaired":
            self.unpaired = _parsed(value) or []
        elif kind == "through":
            self.through = _parsed(value) or []

    def facts(self, number: int, where: str) -> RegionFacts:
        return RegionFacts(number, self.phase, where, inputs=tuple(self.inputs),
                           outputs=tuple(self.outputs), readers=tuple(self.readers),
                           made=tuple(self.made), module=self.module,
                           unpaired=tuple(self.unpaired), through=tuple(self.through))


def _old_places(rows: Sequence[TensorRow]) -> dict[int, str]:
    """region number -> the place its old label names ("region 2 in X" -> X), from the rows."""
    out: dict[int, str] = {}
    for row in rows:
        words = (row.region or "").split(" ", 3)
        if len(words) > 1 and words[0] == "region" and words[1].isdigit():
            out.setdefault(int(words[1]), words[3] if len(words) == 4 and words[2] == "in" else "")
    return out


def _region_number(unit: str) -> Optional[int]:
    parts = unit.split(".")
    ok = len(parts) == 3 and parts[0] == "Region" and parts[1].isdigit()
    return int(parts[1]) if ok else None


def _parsed(text: str, size: int = -1) -> Optional[list[str]]:
    """A JSON list of strings (of `size` items when given), or None (a mark is untrusted)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if _strings(value, size) else None


def _strings(value: object, size: int = -1) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value) and \
        (size < 0 or len(value) == size)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def for_pair(facts: Sequence[PairFacts], rows: Sequence[TensorRow], step: Optional[int],
             rank: Optional[int]) -> PairFacts:
    """The facts a result saved for one pair, with what its rows' old marks say (rows an older
    opdiff wrote; a newer one writes none)."""
    saved = [f for f in facts if (f.step, f.rank) == (step, rank)]
    old = PairFacts.from_marks(rows, step, rank)
    return saved[0] | old if saved else old


__all__ = ["PairFacts", "RegionFacts", "ForcedFacts", "region_label", "for_pair"]
