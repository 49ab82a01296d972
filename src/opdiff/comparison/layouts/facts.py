"""What `logical_pairs` did with one side of one step, as data: `LayoutFacts`.

The notes say it in words ("the target's ranks [0, 1] were merged into one run ..."); these
facts say it for tools (summary.json `layouts`, report.html's "Rank layouts" section):

    facts = LayoutFacts(side="target", step=0, kinds=("tp",), world=2, ranks=(0, 1),
                        counts={"shard": 52, "partial": 3, "replicate": 45}, left_out=2)
    LayoutFacts.from_json(facts.to_json()) == facts

kinds: how the ranks were laid out, as read from the dump: "tp" (tensor parallel: DTensor
placements), "ddp" (data parallel: the batch split over ranks), "fsdp" (FSDP2's parameter
all-gathers), "sequence" (DTensor reorders around collectives: sequence parallel), "mesh" (a 2-D
mesh merged in two levels), "pipeline" (stages chained), "declared" (a layout file, `--layout`,
said it), "none" (one rank: nothing merged).
how: "merged" (pieces joined into one run), "chained" (pipeline stages), "one rank".
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

KINDS = ("tp", "ddp", "fsdp", "sequence", "mesh", "pipeline", "declared", "none")
HOWS = ("merged", "chained", "one rank")


@dataclass(frozen=True)
class Replica:
    """A replica that differs: rank `rank`'s copy of `tensor` is not rank `against`'s."""
    tensor: str
    rank: int
    against: int

    def to_json(self) -> dict[str, object]:
        return {"tensor": self.tensor, "rank": self.rank, "against": self.against}

    @classmethod
    def from_json(cls, data: object) -> Optional["Replica"]:
        if not isinstance(data, Mapping):
            return None
        tensor, rank, against = data.get("tensor"), data.get("rank"), data.get("against")
        if not isinstance(tensor, str) or not _int(rank) or not _int(against):
            return None
        return cls(tensor, int(rank), int(against))       # type: ignore[arg-type]


@dataclass(frozen=True)
class LayoutFacts:
    """One side of one step as `logical_pairs` laid it out (see the module docstring)."""
    side: str                                   # "target" | "golden"
    step: Optional[int]
    kinds: tuple[str, ...]
    world: int                                  # its ranks (the world size capture recorded)
    ranks: tuple[int, ...]                      # the ranks merged or chained, in order
    how: str = "merged"
    mesh: tuple[int, ...] = ()                  # a 2-D mesh: (groups, ranks per group)
    counts: dict[str, int] = field(default_factory=dict)    # tensors merged, by layout
    left_out: int = 0                           # layout records left out (collectives, views)
    unknown: int = 0                            # tensors whose layout nothing records
    replicas: tuple[Replica, ...] = ()          # replicas that differ
    culprit_ranks: tuple[int, ...] = ()         # whose piece (or stage) of the culprit differs

    def named(self, ranks: tuple[int, ...]) -> "LayoutFacts":
        return replace(self, culprit_ranks=tuple(ranks))

    def to_json(self) -> dict[str, object]:
        return {"side": self.side, "step": self.step, "kinds": list(self.kinds),
                "world": self.world, "ranks": list(self.ranks), "how": self.how,
                "mesh": list(self.mesh), "counts": dict(sorted(self.counts.items())),
                "left_out": self.left_out, "unknown": self.unknown,
                "replicas": [r.to_json() for r in self.replicas],
                "culprit_ranks": list(self.culprit_ranks)}

    @classmethod
    def from_json(cls, data: object) -> Optional["LayoutFacts"]:
        """The facts a summary.json entry holds; None for an entry that is not one (a file is
        untrusted: a wrong entry is left out)."""
        if not isinstance(data, Mapping):
            return None
        side, step, kinds, how = (data.get(k) for k in ("side", "step", "kinds", "how"))
        world, left_out, unknown = (data.get(k, 0) for k in ("world", "left_out", "unknown"))
        ints = [data.get(k, []) for k in ("ranks", "mesh", "culprit_ranks")]
        counts, replicas = data.get("counts", {}), data.get("replicas", [])
        if not isinstance(side, str) or not (step is None or _int(step)) or \
                not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds) or \
                not isinstance(how, str) or not all(map(_int, (world, left_out, unknown))) or \
                not all(isinstance(v, list) and all(map(_int, v)) for v in ints) or \
                not isinstance(counts, Mapping) or not all(map(_int, counts.values())) or \
                not isinstance(replicas, list):
            return None
        found = [Replica.from_json(r) for r in replicas]
        if any(r is None for r in found):
            return None
        return cls(side, step, tuple(kinds), int(world), tuple(ints[0]), how,
                   tuple(ints[1]), {str(k): int(v) for k, v in counts.items()},
                   int(left_out), int(unknown),
                   tuple(r for r in found if r is not None), tuple(ints[2]))


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


__all__ = ["LayoutFacts", "Replica", "KINDS", "HOWS"]
