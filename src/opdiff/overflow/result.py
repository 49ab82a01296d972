"""What `opdiff overflow` finds: origins, the chain they spread through, loss-scaler verdicts and
fp16 headroom warnings. The console summary and overflow.json are made only from these."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ..store.records import SCHEMA_VERSION, json_text
from ..store.schema import Location

# Status of one step/rank, worst first.
OVERFLOW = "overflow"                   # an op created inf/NaN: a model problem
INHERITED = "inherited"                 # inf/NaN arrived from outside the recorded ops (data, params)
SKIPPED = "skipped_by_loss_scaler"      # inf/NaN only in gradients, and the loss scaler skipped the step
DISCARDED = "created_and_discarded"     # inf/NaN made, but it never reached a gradient or the output
CLEAN = "clean"
STATUS_ORDER = (OVERFLOW, INHERITED, SKIPPED, DISCARDED, CLEAN)


@dataclass(frozen=True)
class Origin:
    """An op whose inputs are finite but whose outputs are not: where inf/NaN was born."""

    name: str                           # record name, e.g. "Torch.exp.0.forward"
    op: str                             # e.g. "Torch.exp"
    phase: str                          # "forward" | "backward"
    kind: str                           # "api" | "module" | "aten" | "param_grad"
    reason: str                         # one sentence: why this op is the origin
    location: Optional[Location]        # the user's source line (backward: the forward call site)
    module: Optional[str] = None        # enclosing module call
    nonfinite: str = "inf"              # what it created: "inf", "NaN" or "inf and NaN"
    outputs: tuple = ()                 # ({"name", "dtype", "shape", "max", "min", "nan", "inf"}, ...)
    inputs: tuple = ()
    step: Optional[int] = None
    rank: Optional[int] = None
    skipped_by_loss_scaler: bool = False
    discarded: bool = False             # its inf/NaN reached no gradient, parameter or output


@dataclass(frozen=True)
class ChainLink:
    """An op that inf/NaN passed through after its origin."""

    name: str
    phase: str
    relation: str                       # "propagates" | "contains origin" | "uses non-finite forward values"


@dataclass(frozen=True)
class HeadroomWarning:
    """An op whose outputs would overflow in fp16 (or come close to their own dtype's limit)."""

    name: str
    phase: str
    dtype: str
    max_abs: float
    limit: float                        # the maximum it was measured against
    limit_dtype: str                    # "float16" or the tensor's own dtype
    tensor: str                         # the tensor's name
    message: str
    location: Optional[Location] = None
    step: Optional[int] = None
    rank: Optional[int] = None


@dataclass
class StepFinding:
    """The analysis of one step of one rank."""

    path: str
    format: str
    step: Optional[int]
    rank: Optional[int]
    status: str                         # one of STATUS_ORDER
    origins: list = field(default_factory=list)         # list[Origin], first one first
    chain: list = field(default_factory=list)           # list[ChainLink], in execution order
    counts: dict = field(default_factory=dict)          # records, nonfinite, propagated, absorbed, ...
    loss_scaler: Optional[dict] = None  # {"op", "found_inf", "skipped"} when scaler ops were recorded
    intentional: list = field(default_factory=list)     # ops fed inf/NaN literals (attention masks)
    message: str = ""


@dataclass
class OverflowResult:
    """Result of `opdiff.overflow.analyze(path)` over every step/rank found under path."""

    dump: str
    steps: list                                          # list[StepFinding], sorted by (step, rank)
    headroom: list = field(default_factory=list)         # list[HeadroomWarning]
    headroom_factor: float = 1.0

    @property
    def origin(self) -> Optional[Origin]:
        """The first model-caused origin over all steps (None: no overflow that needs fixing)."""
        for s in self.steps:
            if s.status in (OVERFLOW, INHERITED) and s.origins:
                return s.origins[0]
        return None

    @property
    def status(self) -> str:
        """The worst status of any step."""
        found = {s.status for s in self.steps} or {CLEAN}
        return next(st for st in STATUS_ORDER if st in found)

    def to_dict(self) -> dict:
        first = next((s for s in self.steps if s.status in (OVERFLOW, INHERITED)), None)
        return {
            "dump": self.dump,
            "status": self.status,
            "origin": _plain(self.origin),
            "chain": [_plain(c) for c in first.chain] if first else [],
            "steps": [_plain(s) for s in self.steps],
            "headroom": {"factor": self.headroom_factor, "warnings": [_plain(w) for w in self.headroom]},
        }

    def write_json(self, out_dir: str | os.PathLike) -> Path:
        """Write `out_dir/overflow.json` (strict JSON) through the output owner
        (`opdiff.outdir`: the user's files there are never overwritten) and return its path."""
        from .. import outdir as outputs

        with outputs.session(out_dir, keep=[self.dump] if self.dump else []) as out:
            return outputs.atomic_write_text(
                out / "overflow.json",
                json_text({"schema_version": SCHEMA_VERSION, **self.to_dict()}, indent=1),
                "overflow.json")


def _plain(obj):
    # Every float in a result is already JSON-safe (see records.encode_float).
    return None if obj is None else asdict(obj)
