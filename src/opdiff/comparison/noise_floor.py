"""A measured noise floor: how far each tensor of two healthy runs lies apart, per tensor name.

`opdiff calibrate A B [C...] -o NOISE` compares healthy golden-like runs (other thread counts,
another seed for nondeterministic kernels only, weights round-tripped through a checkpoint)
with one another and keeps, for every tensor, the largest relative error and scale error any
two of them showed (`opdiff.calibration`). `opdiff compare T G --noise NOISE` then judges each
op against max(dtype floor, k x its measured floor) (`verdicts.Policy.measured_tolerances`)
and says each error as a multiple of its floor.

    floor = NoiseFloor.load("noise/")              # noise/noise_floor.json
    floor.floor_for("Functional.linear.3.forward.output.0")   # MeasuredFloor(error=2.1e-07, ...)

Tensors are keyed by their name without step or rank (`Functional.linear.3.forward.output.0`):
runs of the same code count their calls alike; a tensor of several steps or ranks keeps the
largest floor of them. A tensor the calibration did not see is judged by its dtype's fixed
tolerances, as without `--noise`. The file follows `schemas/noise-floor.schema.json`.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

from ..errors import ConfigError

if TYPE_CHECKING:
    from .result import TensorRow
    from .verdicts import Policy

FILE = "noise_floor.json"


@dataclass(frozen=True)
class MeasuredFloor:
    """The largest difference healthy runs showed on one tensor."""
    error: float                # relative L2 error (`opdiff.comparison.metrics`)
    scale_error: float          # |<t,g>/<g,g> - 1|
    dtype: Optional[str] = None
    samples: int = 1            # pairs of runs that measured it
    mode: str = "tensor"        # "tensor" | "statistics": what the calibration compared

    def merged(self, error: float, scale_error: float) -> "MeasuredFloor":
        return MeasuredFloor(max(self.error, error), max(self.scale_error, abs(scale_error)),
                             self.dtype, self.samples + 1, self.mode)


@dataclass
class NoiseFloor:
    """Tensor name -> MeasuredFloor, and what it was measured from."""
    floors: dict[str, MeasuredFloor] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    pairs: int = 0
    named: list[str] = field(default_factory=list)  # what compares of healthy runs named

    def add_rows(self, rows: Iterable[TensorRow]) -> None:
        """Fold one compare's rows (`TensorRow`s of two healthy runs) into the floors."""
        for row in rows:
            name = row.golden_name or row.target_name
            err, scale = row.error, row.scale_error
            if name is None or err is None or not math.isfinite(err):
                continue
            scale = abs(scale) if scale is not None and math.isfinite(scale) else 0.0
            had = self.floors.get(name)
            self.floors[name] = had.merged(err, scale) if had is not None else MeasuredFloor(
                err, scale, row.golden_dtype or row.target_dtype, 1, row.mode)

    def floor_for(self, name: Optional[str]) -> Optional[MeasuredFloor]:
        """The floor of a tensor name, None when the calibration did not see it."""
        return self.floors.get(name) if name else None

    def to_document(self) -> dict[str, Any]:
        from ..store.records import SCHEMA_VERSION

        return {"schema_version": SCHEMA_VERSION, "runs": list(self.runs), "pairs": self.pairs,
                "named": list(self.named),
                "floors": {name: {"error": f.error, "scale_error": f.scale_error,
                                  "dtype": f.dtype, "samples": f.samples, "mode": f.mode}
                           for name, f in sorted(self.floors.items())}}

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "NoiseFloor":
        """From NOISE_DIR (holding noise_floor.json) or the file itself; one-line ConfigError
        when it is missing or not a noise floor."""
        p = Path(os.fspath(path))
        file = p / FILE if p.is_dir() else p
        if not file.is_file():
            raise ConfigError(f"{p}: no {FILE} there; make one with "
                              f"'opdiff calibrate GOLDEN_A GOLDEN_B -o {p}'")
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
            floors = {str(name): MeasuredFloor(_number(f["error"]), _number(f["scale_error"]),
                                               f.get("dtype"), int(f.get("samples", 1)),
                                               str(f.get("mode", "tensor")))
                      for name, f in doc["floors"].items()}
            return cls(floors, [str(r) for r in doc.get("runs", [])], int(doc.get("pairs", 0)),
                       [str(n) for n in doc.get("named", [])])
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: not a noise floor written by 'opdiff calibrate' "
                              f"({type(exc).__name__}: {exc}); make it again") from None


def _number(value: Any) -> float:
    from ..store.records import decode_float

    v = float(decode_float(value))
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"a floor must be a finite number >= 0, not {value!r}")
    return v


def multiple(error: Optional[float], floor: MeasuredFloor) -> Optional[float]:
    """An error as a multiple of its measured floor (None when either is not a number; inf
    when the floor is 0: healthy runs agreed exactly)."""
    if error is None or not math.isfinite(error):
        return None
    if floor.error <= 0:
        return math.inf if error > 0 else 0.0
    return error / floor.error


def multiple_words(error: Optional[float], floor: MeasuredFloor) -> str:
    """'error = 3.1x its measured floor 2.3e-07' (or '... healthy runs agreed exactly')."""
    times = multiple(error, floor)
    if times is None:
        return ""
    if math.isinf(times):
        return f"error {error:.3g} where healthy runs agreed exactly"
    return f"error = {times:.2g}\u00d7 its measured floor {floor.error:.3g}"


def noise_note(floor: Optional[NoiseFloor], policy: Policy) -> list[str]:
    """The note a compare with a measured noise floor carries (none without one)."""
    if floor is None:
        return []
    k = policy.thresholds.noise_multiple
    return [f"judged against measured noise floors: {len(floor.floors)} tensors measured by "
            f"{floor.pairs} compare(s) of {len(floor.runs)} healthy runs; each against "
            f"max(dtype floor, {k:g}x its floor), the others by their dtype's tolerance"]


__all__ = ["FILE", "noise_note", "MeasuredFloor", "NoiseFloor", "multiple", "multiple_words"]
