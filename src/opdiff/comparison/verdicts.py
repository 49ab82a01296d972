"""Verdicts: is a tensor close enough to golden, and is an op to blame for the error it shows.

Errors are judged against what the *lower* precision of the pair can represent: a bf16 tensor
compared with an fp32 golden is judged by bf16's resolution, never flagged for the dtype change.

Default tolerances (relative L2 error |t - g| / |g|, see `opdiff.comparison.metrics`):

    dtype      agree (pass)   tolerance (error)   why
    bfloat16   8e-3           1.6e-2              unit roundoff u = 2^-8 = 3.9e-3; one rounding
                                                  costs about 0.4u, an op in bf16 (rounded inputs,
                                                  weights and output) about 1u: 4u leaves room
    float16    1e-3           2e-3                u = 2^-11 = 4.9e-4, same reasoning
    float32    5e-6           1e-5                u = 6e-8, but other devices sum in other orders
                                                  (and may use TF32-free but blocked kernels): about
                                                  sqrt(K) u for a K-long reduction, 1e-5 covers K ~ 1e4
    float64    1e-12          1e-10
    integer    0              0                   integers and bools must be equal

A tensor passes below "agree", is a warning up to "tolerance" and beyond it the verdict depends
on where the error comes from (see `opdiff.comparison.blame`): error made by this op is an
`error`, error carried in by the op's inputs is a `warning`. `Accuracy Reached or Not` is `No`
exactly when the tensor is beyond the tolerance (or its inf/NaN positions or shapes differ).

Local error (the first-divergence rule, applied to the worst output of each op): the op made the
error itself when

    error_out > tolerance  and  error_out > amplification * error_in          (random error)
    or |scale_out| > scale_tolerance + scale_amplification * |scale_in|
                                      and  |scale_out| > f(n) * error_in
                                                                                  (systematic error)

where error_in / scale_in are the worst over the op's inputs and parameters (and, for backward
records, over the forward call's tensors too), and the tolerances are those of the output's
dtype pair but never finer than the coarsest dtype of the whole compare (in a bf16 autocast run
an fp32 op still handles values carrying bf16 noise). amplification defaults to 10 (the design's "an
order of magnitude above what the inputs carry"). A systematic error passes through most ops at
about its own size (x**2 doubles it), hence scale_amplification = 3; random input noise projects onto the output's
scale only partly for big tensors, fully for tiny ones, hence f(n) = min(1, max(0.5, 4/sqrt(n)))
(0.5 is `scale_noise_fraction`; a healthy bf16 BatchNorm weight gradient of 16 elements showed a
scale error of half its input error). The scale test catches faults far below the
random-noise tolerance, e.g. an output scaled by 1+1e-2 in a bf16 run: rounding noise is
unbiased and averages out of <t,g>/<g,g>, a wrong scale does not. For a one-element
output (a loss) nothing averages out, so there the scale error must exceed the whole input error
(measured on small CNN, LSTM and transformer runs: healthy 20-element logits keep a scale error
near 1e-4, healthy losses stay below their input error).

Statistics-only dumps (task="statistics": max, min, mean and L2 norm per tensor, no tensors).
The error measured from statistics is a lower bound of the real one, and a loose one for inputs:
random rounding noise averages out of a norm or a mean, so an input whose statistics agree may
still carry several units of roundoff that an op's output then shows (most of all a small
output made by cancellation, or a gradient behind BatchNorm). Without tensors nothing can rule
that out, and replay needs tensors. So an op is blamed from statistics only when its output's
error also exceeds a floor: for the random rule `statistics_tolerance` (max, min and mean of a
bf16 tensor move by a unit of roundoff or two at their extreme elements), for the scale rule
`statistics_scale_tolerance` (the norm averages, so it moves less), and in backward
`statistics_backward_tolerance` for both (gradients behind BatchNorm move in norm as in
extremes):

    dtype      random   scale    backward   largest error an op seemed to make while its
                                            inputs' statistics agreed, healthy runs (CNN, LSTM,
                                            transformer, 3D-ResNet; 9 seeds, SGD steps 0 to 3):
                                            random / scale / backward
    bfloat16   2e-2     8e-3     0.5        bf16 autocast vs fp32: 1.1e-2 / 3.3e-3 / 0.21
    float16    2.5e-3   1e-3     6e-2       bf16's scaled by the ratio of unit roundoffs (1/8)
    float32    1e-5     4e-6     4e-5       fp32 vs fp64: 4.5e-7 / 1.9e-7 / 5.1e-6
                                            (fp32 vs fp32 on one machine: 0)

For outputs of n < 32 elements (`statistics_small_numel`) the floors grow by 32 / n: four
statistics of a handful of values average nothing out, and small outputs are where
cancellation lives (an 8-element bf16 linear output whose values had been trained towards 0
moved by 3.6e-2, its norm by 1.9e-2; 8-element BatchNorm weight gradients by 0.44).

What statistics still find, with these floors (planted faults at 24 sites of those models,
step 0): fp32 1e-4 faults forward and backward at every site; bf16 forward 5e-2 at every site,
1e-2 at 18 (not on outputs of under 32 elements, nor behind one ReLU); a forward sign flip at 21
(a flipped BatchNorm output keeps its statistics: the next op is named); bf16 backward x2 at
every site, a backward sign flip at 5, 5e-2 and 1e-2 nowhere (healthy bf16 gradients move as
much). The compare adds a note with these limits whenever it compared statistics
(`opdiff.comparison.reasons.statistics_limits`).

Subclass `Policy` to change how tensors are judged (the ONNX compare applies msit's thresholds).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from ..dtypes import _ALIASES as DTYPE_ALIASES   # the spellings users write ('bf16', 'half')
from ..dtypes import coarser, is_float, unit_roundoff
from ..errors import ConfigError
from .metric_table import Measurement
from .noise_floor import MeasuredFloor, NoiseFloor
from .result import ERROR, PASS, WARNING, TensorRow

# One row per precision class (`opdiff.dtypes.canonical_dtype`); why these numbers: see above.
# Changing a dtype's thresholds is editing its row; a new precision class is a new row.
DTYPE_COLUMNS = ("tolerance", "scale_tolerance", "statistics_tolerance",
                 "statistics_scale_tolerance", "statistics_backward_tolerance")
DTYPE_THRESHOLDS = {
    #            tolerance  scale    statistics  statistics  statistics
    #                                (random)    (scale)     (backward)
    "float8":   (1.25e-1,   3e-2,    2.5e-1,     6e-2,       1.0),
    "bfloat16": (1.6e-2,    4e-3,    2e-2,       8e-3,       5e-1),
    "float16":  (2e-3,      5e-4,    2.5e-3,     1e-3,       6e-2),
    "float32":  (1e-5,      2e-6,    1e-5,       4e-6,       4e-5),
    "float64":  (1e-10,     1e-12,   1e-10,      4e-11,      4e-10),
    "int":      (0.0,       0.0,     0.0,        0.0,        0.0),
}
_FALLBACK = "float32"           # a precision class without a row is judged like float32
# With a measured noise floor (`opdiff compare --noise`), the least tolerance of a tensor, in
# units of roundoff of its dtype: bf16's and fp16's fixed tolerances are 4u too.
DTYPE_FLOOR_ROUNDINGS = 4.0
# Two runs that each round a reduction: their results may lie this many units of roundoff
# (times sqrt of the reduction's length, times the scale of its terms) apart.
ROUNDINGS_APART = 2.0


def _column(name: str) -> Callable[[], dict[str, float]]:
    """The default of one per-dtype Thresholds field: {dtype: number} from the table."""
    i = DTYPE_COLUMNS.index(name)
    return lambda: {dtype: row[i] for dtype, row in DTYPE_THRESHOLDS.items()}


def _row_key(name: str) -> str | None:
    """The table row a dtype name written by a user stands for ('bf16' -> 'bfloat16'), None
    when it names no dtype (a typo must not quietly set float32's row)."""
    key = str(name).lower().replace("torch.", "")
    if key in DTYPE_THRESHOLDS:
        return key
    return DTYPE_ALIASES.get(key)


@dataclass(frozen=True)
class Thresholds:
    """Numbers behind every verdict. Load with `Thresholds.load(path_or_dict)`; see module doc."""
    tolerance: dict[str, float] = field(default_factory=_column("tolerance"))
    agree_fraction: float = 0.5         # pass below this fraction of the tolerance
    amplification: float = 10.0         # local error must exceed input error by this factor
    scale_tolerance: dict[str, float] = field(default_factory=_column("scale_tolerance"))
    scale_min_numel: int = 1
    scale_amplification: float = 3.0
    scale_noise_fraction: float = 0.5
    statistics_tolerance: dict[str, float] = field(default_factory=_column("statistics_tolerance"))
    statistics_scale_tolerance: dict[str, float] = field(default_factory=_column("statistics_scale_tolerance"))
    statistics_backward_tolerance: dict[str, float] = field(
        default_factory=_column("statistics_backward_tolerance"))
    statistics_small_numel: int = 32
    noise_multiple: float = 3.0         # --noise: an op is judged against k x its measured floor

    _KEYS = ("tolerance", "agree_fraction", "amplification", "scale_tolerance", "scale_min_numel",
             "scale_amplification", "scale_noise_fraction", "statistics_tolerance",
             "statistics_scale_tolerance", "statistics_backward_tolerance",
             "statistics_small_numel", "noise_multiple")
    _DTYPE_TABLES = DTYPE_COLUMNS

    @classmethod
    def load(cls, source: Any = None, overrides: dict[str, Any] | None = None) -> "Thresholds":
        """From None (defaults), a dict, a Thresholds, or a JSON file path; then `overrides`.

        A JSON file / dict looks like `{"tolerance": {"bf16": 2e-2}, "amplification": 5}`;
        override keys may also be a bare dtype (`{"bf16": 2e-2}`) for its tolerance.
        """
        data: dict[str, Any]
        if isinstance(source, Thresholds):
            base, data = source, {}
        elif source is None:
            base, data = cls(), {}
        elif isinstance(source, dict):
            base, data = cls(), dict(source)
        else:
            path = Path(os.fspath(source))
            if not path.is_file():
                raise ConfigError(f"{path}: thresholds file not found; pass a JSON file such as "
                                  f'{{"tolerance": {{"bfloat16": 0.02}}}}')
            try:
                data = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{path}: not valid JSON ({exc}); fix the thresholds file") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: expected a JSON object of thresholds")
            base = cls()
        data.update(overrides or {})
        return base._with(data)

    def _with(self, data: dict[str, Any]) -> "Thresholds":
        tables: dict[str, Any] = {key: dict(getattr(self, key)) for key in self._DTYPE_TABLES}
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if key in tables:
                if not isinstance(value, dict):
                    raise ConfigError(f"threshold '{key}' must map dtypes to numbers, e.g. "
                                      f'{{"bfloat16": 0.02}}')
                for dt, v in value.items():
                    tables[key][self._dtype_key(dt)] = self._number(f"{key}.{dt}", v)
            elif key in self._KEYS:
                changes[key] = self._number(key, value)
            elif _row_key(key) is not None:
                tables["tolerance"][self._dtype_key(key)] = self._number(key, value)
            else:
                raise ConfigError(f"unknown threshold '{key}'; use one of {', '.join(self._KEYS)} "
                                  f"or a dtype name such as bf16")
        for key in ("scale_min_numel", "statistics_small_numel"):
            if key in changes:
                changes[key] = int(changes[key])
        return replace(self, **tables, **changes)

    @staticmethod
    def _dtype_key(name: str) -> str:
        key = _row_key(name)
        if key is None:
            raise ConfigError(f"unknown dtype '{name}' in thresholds; use bf16, fp16, fp32 or fp64")
        return key

    @staticmethod
    def _number(name: str, value: Any) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"threshold '{name}' must be a number, got {value!r}") from None
        if not math.isfinite(v) or v < 0:
            raise ConfigError(f"threshold '{name}' must be a finite number >= 0, got {value!r}")
        return v


def run_precision(rows: Iterable[TensorRow]) -> str | None:
    """The coarsest float dtype of a compare's rows: in a bf16 autocast run even fp32 ops handle
    values that carry bf16 noise, so no op is held to a finer floor than the run's precision."""
    coarsest = None
    seen = set()
    for row in rows:
        for dt in (row.target_dtype, row.golden_dtype):
            if dt and dt not in seen:
                seen.add(dt)
                if is_float(dt):
                    coarsest = dt if coarsest is None else coarser(coarsest, dt)
    return coarsest


@dataclass(frozen=True)
class Verdict:
    """One tensor's verdict on its own."""
    result: str                 # PASS | WARNING | ERROR
    accuracy_reached: str       # "Yes" | "No"
    reason: str


class Policy:
    """Turns a tensor's measurement into a verdict.

    `judge(measurement, target_dtype, golden_dtype)` -> Verdict for one tensor on its own is what
    subclasses change (the ONNX compare applies msit's rule). The blame rules
    (`opdiff.comparison.blame`) call `tolerance_for` / `scale_tolerance_for` /
    `statistics_tolerance_for` and `amplification`.
    """

    def __init__(self, thresholds: Thresholds | dict[str, Any] | str | None = None,
                 noise: NoiseFloor | None = None) -> None:
        self.thresholds = Thresholds.load(thresholds)
        self.noise = noise          # measured floors (`opdiff calibrate`), or None

    def measured_floor(self, row: TensorRow) -> MeasuredFloor | None:
        """The measured noise floor of a compared tensor's row (by its golden name), if any."""
        if self.noise is None:
            return None
        return self.noise.floor_for(row.golden_name) or self.noise.floor_for(row.target_name)

    def measured_tolerances(self, floor: MeasuredFloor, target_dtype: str | None,
                            golden_dtype: str | None) -> tuple[float, float]:
        """(tolerance, scale tolerance) of a tensor whose noise was measured: max(dtype floor,
        k x measured floor), k = `noise_multiple`. The dtype floor is `DTYPE_FLOOR_ROUNDINGS`
        units of roundoff (one rounding for the scale): what an op's own roundings cost. It
        replaces the fixed tolerance, whose float32 row guesses at other summation orders:
        that part is measured now."""
        u = unit_roundoff(coarser(target_dtype, golden_dtype))
        k = self.thresholds.noise_multiple
        return (max(DTYPE_FLOOR_ROUNDINGS * u, k * floor.error),
                max(u, k * floor.scale_error))

    @property
    def amplification(self) -> float:
        """How far an op's output error must exceed its inputs' to be its own."""
        return self.thresholds.amplification

    def _lookup(self, table: dict[str, float], target_dtype: str | None,
                golden_dtype: str | None) -> float:
        return table.get(coarser(target_dtype, golden_dtype), table[_FALLBACK])

    def tolerance_for(self, target_dtype: str | None, golden_dtype: str | None) -> float:
        """Relative L2 error beyond which a tensor of this dtype pair does not agree."""
        return self._lookup(self.thresholds.tolerance, target_dtype, golden_dtype)

    def run_tolerance_for(self, target_dtype: str | None, golden_dtype: str | None,
                          run_dtype: str | None) -> float:
        """`tolerance_for` a tensor of a run whose precision is `run_dtype` (`run_precision`):
        the coarser of its own dtype pair's and the run's."""
        return max(self.tolerance_for(target_dtype, golden_dtype),
                   self.tolerance_for(run_dtype, run_dtype))

    def beyond_run_tolerance(self, row: TensorRow, run_dtype: str | None) -> bool:
        """Whether a compared tensor's row (`TensorRow`) differs beyond what its run allows
        (`run_tolerance_for`): a float32 tensor of a bf16 autocast run carries bf16 noise (a
        gradient computed in bf16 and widened, a residual stream fed by bf16 matmuls), so it
        is evidence of a difference only beyond bf16's tolerance. A row without a finite
        error (shapes or inf/NaN positions differ) always is."""
        err = row.error
        if err is None or not math.isfinite(err):
            return True
        return bool(err > self.run_tolerance_for(row.target_dtype, row.golden_dtype, run_dtype))

    def scale_tolerance_for(self, target_dtype: str | None, golden_dtype: str | None) -> float:
        """Scale error (<t,g>/<g,g> - 1) beyond which an output's scale is off."""
        return self._lookup(self.thresholds.scale_tolerance, target_dtype, golden_dtype)

    def statistics_tolerance_for(self, target_dtype: str | None, golden_dtype: str | None,
                                 phase: str = "forward", numel: int = 0,
                                 scale: bool = False) -> float:
        """The smallest error an op may be blamed for when only statistics were compared
        (max, min, mean, norm of each side; see the module docstring); scale: the floor for a
        change of the norm alone (forward only). Larger in backward, and for tensors of fewer
        than `statistics_small_numel` elements."""
        t = self.thresholds
        if phase == "backward":
            table = t.statistics_backward_tolerance
        else:
            table = t.statistics_scale_tolerance if scale else t.statistics_tolerance
        floor = self._lookup(table, target_dtype, golden_dtype)
        if 0 < numel < t.statistics_small_numel:
            floor *= t.statistics_small_numel / numel
        return floor

    def within_input_noise(self, out: Measurement, inputs: Iterable[Measurement],
                           tolerance: float, same_rounding: bool = False,
                           dtype: str | None = None) -> bool:
        """Is a backward output's difference rounding noise of the values it was computed from?

        A gradient that is mathematically 0 (the key projection's bias gradient: softmax is
        shift-invariant) is the sum of terms that cancel, so both sides are rounding noise of
        the grad-outputs, and relative to its own size it differs by 100% and more. Measured
        against the scale of what produced it, the largest L2 norm among the backward record's
        inputs that hold at least as many elements as the output (the grad-outputs it was
        reduced or projected from; LayerNorm's input gradient of a loss its output's norm
        cannot change is the same story), it is within the dtype's `tolerance`:
        |t - g| <= tolerance * |grad_output| while |out| < |grad_output|. Inputs whose
        norm was not measured (identical pairs) give no scale, so the rule never applies there.

        same_rounding: both sides computed the output in the same dtype. Then rounding is not
        what tells the two runs apart; the difference an input carries in is its own: input i
        explains at most |input_i| * min(tolerance, amplification * error_i) of the output's
        difference, nothing when it is the same in both runs. An aten backward record's inputs
        hold the forward tensors it saved (`silu_backward(grad_output, self)`), whose norm is
        no gradient's and may be hundreds of times the output's; measured against it in full,
        a wrong backward kernel of an fp32 run (1% off in `silu_backward`) passed for noise.
        But once input i differs at all, the op's own roundings differ too: each side's
        reduction of K = numel_i / numel_out terms rounds by up to sqrt(K) units of roundoff of
        `dtype` (the output's) times |input_i|, in each run, whatever the input's own error.
        That is what a gradient that cancels to a true zero differs by: a tiny BERT's key bias
        gradient (2e-12, of 16 rows of 3e-5) moved by 55% between two fp32 runs whose weights
        differed by 1e-7, 1.6x what input error alone explained (and statistics only give a
        lower bound of that), and `Functional.linear.1.backward` was named.
        """
        budget, scale = 0.0, 0.0
        roundoff = unit_roundoff(dtype) if dtype is not None else 0.0
        for m in inputs:
            if m.numel < out.numel or not math.isfinite(m.norm) or m.norm <= 0:
                continue
            share = tolerance
            if same_rounding:
                share = min(tolerance, self.amplification * (math.inf if m.nonfinite_mismatch
                                                             else m.error))
                if m.error > 0 or m.nonfinite_mismatch:     # its roundings differ: see above
                    share = max(share, ROUNDINGS_APART * roundoff
                                * math.sqrt(m.numel / max(out.numel, 1)))
            if share > 0:
                budget, scale = max(budget, share * m.norm), max(scale, m.norm)
        return scale > 0 and out.norm < scale and out.abs_error <= budget

    def judge(self, measurement: Measurement, target_dtype: str | None, golden_dtype: str | None) -> Verdict:
        """Verdict for one tensor on its own (the blame rules may then soften an error that
        the op's inputs explain into a warning)."""
        dt = coarser(target_dtype, golden_dtype)
        tol = self.tolerance_for(target_dtype, golden_dtype)
        if measurement.nonfinite_mismatch:
            return Verdict(ERROR, "No", measurement.message or "inf/NaN positions differ")
        err = measurement.error
        if err <= tol * self.thresholds.agree_fraction:
            return Verdict(PASS, "Yes", "")
        if err <= tol:
            return Verdict(WARNING, "Yes", f"relative error {err:.3g} is close to the {dt} "
                                           f"tolerance {tol:.3g}")
        return Verdict(ERROR, "No", f"relative error {err:.3g} exceeds the {dt} tolerance {tol:.3g}")


__all__ = ["Thresholds", "Policy", "Verdict", "run_precision", "DTYPE_THRESHOLDS", "DTYPE_COLUMNS"]
