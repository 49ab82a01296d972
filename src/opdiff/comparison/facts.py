"""What a plan decided of one step/rank pair that the judge needs besides the rows: one typed
object, saved in summary.json ("facts", `schemas/compare-summary.schema.json`) so that
`rejudge` judges with what the compare decided, not with what it can guess from the rows.

    facts = PairFacts(step=0, rank=0, withheld=("model.norm.weight.param_grad.0",))
    PairFacts.from_json(facts.to_json()) == facts

`withheld`: records blame never names (the parameter gradients of a compiled backward that is
not recorded: `compiled_backward.withheld`); `exposed`: judged module calls of compiled code
that unjudged compiled code ran before, not named where their input already differs in
statistics (`compiled_inputs.exposed`, applied by `judgement.not_named`).

Results written before summary.json held facts kept them as row marks ("withheld:<record>",
"exposed:<record>" in `TensorRow.boundary`): `from_marks` reads those, the one place that does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from .result import TensorRow

_OLD_MARKS = {"withheld": "withheld", "exposed": "exposed"}     # mark -> field


@dataclass(frozen=True)
class PairFacts:
    """One pair's decisions, by record name (sorted: the file is stable)."""
    step: Optional[int] = None
    rank: Optional[int] = None
    withheld: tuple[str, ...] = ()
    exposed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.withheld or self.exposed)

    @classmethod
    def of(cls, step: Optional[int], rank: Optional[int], withheld: Iterable[str] = (),
           exposed: Iterable[str] = ()) -> "PairFacts":
        return cls(step, rank, tuple(sorted(set(withheld))), tuple(sorted(set(exposed))))

    def at(self, step: Optional[int], rank: Optional[int]) -> "PairFacts":
        return PairFacts(step, rank, self.withheld, self.exposed)

    def to_json(self) -> dict[str, object]:
        return {"step": self.step, "rank": self.rank, "withheld": list(self.withheld),
                "exposed": list(self.exposed)}

    @classmethod
    def from_json(cls, data: object) -> Optional["PairFacts"]:
        """The facts a summary.json entry holds; None for an entry that is not one (a file is
        untrusted: a wrong entry is ignored, as if the compare had decided nothing)."""
        if not isinstance(data, Mapping):
            return None
        step, rank = data.get("step"), data.get("rank")
        names = [data.get("withheld", []), data.get("exposed", [])]
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool))
                   for v in (step, rank)):
            return None
        if not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in names):
            return None
        return cls.of(step, rank, names[0], names[1])

    @classmethod
    def from_marks(cls, rows: Sequence[TensorRow], step: Optional[int] = None,
                   rank: Optional[int] = None) -> "PairFacts":
        """The shim for results written before facts were saved: their rows' marks."""
        found: dict[str, set[str]] = {field: set() for field in _OLD_MARKS.values()}
        for row in rows:
            for mark in row.boundary:
                kind, _, name = mark.partition(":")
                if kind in _OLD_MARKS and name:
                    found[_OLD_MARKS[kind]].add(name)
        return cls.of(step, rank, found["withheld"], found["exposed"])


def for_pair(facts: Sequence[PairFacts], rows: Sequence[TensorRow], step: Optional[int],
             rank: Optional[int]) -> PairFacts:
    """The facts a result saved for one pair; from its rows' old marks when it saved none."""
    saved = [f for f in facts if (f.step, f.rank) == (step, rank)]
    return saved[0] if saved else PairFacts.from_marks(rows, step, rank)


__all__ = ["PairFacts", "for_pair"]
