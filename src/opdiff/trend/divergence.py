"""Where two runs part: the first step, and in it the first module, whose numbers leave the band
of normal drift between the runs.

    part = compare_streams(target_stream, golden_stream)
    part.first              # Departure (step, slot, sigma, reason) or None
    part.verdict            # "parted", "drift" (gradual, no step stands out) or "agree"

Per column, the distance of the runs at a step is the relative difference of the two values.
Its normal level is learned from the runs themselves, in log10 units: the median and the MAD of
the previous block of steps (in the first block, of every earlier step), never tighter than a
tenth of a decade, and moved along the growth from one block to the next (runs that drift
apart steadily, as a bf16 run does from an fp32 one, stay inside). A step departs when it lies
`sigma` MADs above that level, is large enough to matter for the dtype (DTYPE_FLOOR), and stays
out over the next steps (a fault persists; noise does not). NaN or inf in one run only departs
at once. Optimizer state and parameter norms never start a departure (they integrate every
earlier step); the update norm does. The first departing step is where the runs part; within
it, the first column in causal order (layout.causal_order) is the culprit, and the rest of the
step's departures say how far it spread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from dataclasses import replace as _replace
from typing import Optional, cast

import numpy as np

from ..errors import StreamError
from .layout import AtSlot, Slot, causal_order, phase_rank

# Healthy bf16-autocast vs fp32 runs of a small transformer (120-200 steps, three seeds) came
# within 4.0-5.5 sigma on some parameter gradient; planted fp32 faults reach tens to hundreds.
SIGMA = 8.0
ZERO = 1e-12                # relative differences below this count as "equal"
SCALE_FLOOR = 0.1           # decades: the band is never narrower than a factor 1.26
PERSIST = 4                 # steps after a departure that must mostly stay out of the band
MIN_HISTORY = 3             # fewer earlier steps than this: only the dtype's prior applies
# The smallest relative difference that can mean something, by the lower precision of the runs.
DTYPE_FLOOR = {"float64": 1e-6, "float32": 1e-6, "float16": 2e-3, "bfloat16": 8e-3}


def how_far(target: float, golden: float, relative: float) -> str:
    """A difference as people read it: "is 2 times golden's (1.2 vs 0.6)" for a factor,
    "differs by 3.1% (1.01 vs 0.98)" for a small change (`relative` is |t - g| / max(|t|, |g|),
    which says 0.5 for a doubling)."""
    values = f"({target:.4g} in target vs {golden:.4g} in golden)"
    if math.isfinite(target) and math.isfinite(golden) and golden != 0 and target / golden > 0:
        ratio = target / golden
        if ratio >= 1.5 or ratio <= 1 / 1.5:
            return f"is {ratio:.3g} times golden's {values}"
        return f"differs by {abs(ratio - 1):.2%} {values}"
    return f"differs by {relative:.1e} of its size {values}"


def relevance_floor(*dtypes) -> float:
    return max([DTYPE_FLOOR.get(d or "float32", 1e-6) for d in dtypes] or [1e-6])


def block_size(n_steps: int) -> int:
    """Steps per baseline block: an eighth of the run, between 8 and 64."""
    return int(min(64, max(8, n_steps // 8)))


@dataclass(frozen=True)
class Departure(AtSlot):
    """One column leaving the band at one step."""

    step: int
    slot: Slot
    relative_difference: float
    sigma: float
    baseline: Optional[tuple]       # (first step, last step) the band was learned from
    exact_before: bool              # the runs were bitwise equal there
    target_value: float
    golden_value: float
    rank: int = 0

    @property
    def quantity(self) -> str:
        return self.slot.quantity

    @property
    def reason(self) -> str:
        s = self.slot
        what = s.label if s.phase != "optimizer" else f"{s.label} of {s.name}"
        if s.is_count or not math.isfinite(self.relative_difference):
            side = "target" if not _finite_and_zero(self.target_value, s) else "golden"
            return f"{what}: inf/NaN in the {side} run only ({self.target_value:g} in target, " \
                   f"{self.golden_value:g} in golden)"
        d = how_far(self.target_value, self.golden_value, self.relative_difference)
        if self.baseline is None:
            return f"{what} {d} in the first steps, beyond what the dtype allows"
        a, b = self.baseline
        if self.exact_before:
            return f"{what} {d}; the runs were bitwise equal in steps {a}-{b}"
        return f"{what} {d}, {self.sigma:.0f} sigma beyond the drift of steps {a}-{b}"

    def to_dict(self) -> dict:
        out = {**self.place_dict(self.reason),
               "relative_difference": _num(self.relative_difference),
               "sigma": _num(self.sigma), "baseline_steps": list(self.baseline or []) or None,
               "target_value": _num(self.target_value), "golden_value": _num(self.golden_value)}
        if self.phase in ("optimizer", "parameters") and self.slot.column != "grad_norm":
            out["parameter"] = self.slot.name
        return out


def _finite_and_zero(value: float, slot: Slot) -> bool:
    return (value == 0) if slot.is_count else math.isfinite(value)


def _num(x: float):
    return x if math.isfinite(x) else repr(x)


@dataclass
class RankComparison:
    """What compare_streams found for one rank."""

    rank: int
    first: Optional[Departure]
    spread: list = field(default_factory=list)      # the other departures at the same step
    steps: int = 0                                  # steps both runs recorded
    floor: float = 1e-6
    verdict: str = "agree"                          # "parted" | "drift" | "agree"
    drift: dict = field(default_factory=dict)       # loss difference at the start and end
    closest: dict = field(default_factory=dict)     # the largest excursion seen: sigma, step, column

    def key(self) -> tuple:
        """Sort key: earliest step, then earliest phase and position, then lowest rank."""
        if self.first is None:
            return (math.inf, 0, 0, self.rank)
        return (self.first.step, phase_rank(self.first.phase), self.first.slot.position, self.rank)


class _Pair:
    """The two runs' values on their common steps and columns, as log10 relative differences."""

    def __init__(self, target, golden, columns=None):
        common, ti, gi = np.intersect1d(target.steps, golden.steps, return_indices=True)
        if len(common) == 0:
            raise StreamError(f"{target.directory} and {golden.directory} have no step in "
                              f"common; were they recorded with different `every`?")
        self.steps = common
        self.slots = [s for s in causal_order(target) if golden.has(s.column)
                      and (columns is None or s.column in columns)]
        self.target, self.golden = target, golden
        self.ti, self.gi = ti, gi
        self.tcols = np.array([target.index(s.column) for s in self.slots], dtype=np.int64)
        self.gcols = np.array([golden.index(s.column) for s in self.slots], dtype=np.int64)
        self.is_count = np.array([s.is_count for s in self.slots], dtype=bool)
        self.where = {s.column: j for j, s in enumerate(self.slots)}
        # A typical magnitude per column keeps quantities that pass near zero from exploding.
        sample = golden.values[gi[:: max(1, len(gi) // 256)]][:, self.gcols].astype(np.float64)
        with np.errstate(all="ignore"):
            self.scale = np.nan_to_num(np.nanmedian(np.abs(sample), axis=0), nan=0.0)

    def values(self, rows: np.ndarray) -> tuple:
        a = self.target.values[np.ix_(self.ti[rows], self.tcols)].astype(np.float64)
        b = self.golden.values[np.ix_(self.gi[rows], self.gcols)].astype(np.float64)
        miss = None
        for stream, idx, cols in ((self.target, self.ti, self.tcols), (self.golden, self.gi, self.gcols)):
            if stream.missing is not None:
                m = stream.missing[np.ix_(idx[rows], cols)]
                miss = m if miss is None else (miss | m)
        return a, b, miss

    def distance(self, rows: np.ndarray) -> np.ndarray:
        """log10 relative difference, rows x columns: -12 equal, inf when only one side is
        finite (or only one side counts inf/NaN), NaN where a side measured nothing."""
        a, b, miss = self.values(rows)
        with np.errstate(all="ignore"):
            den = np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-3 * self.scale)
            d = np.abs(a - b) / np.maximum(den, 1e-30)
            d[a == b] = 0.0
            fa, fb = np.isfinite(a), np.isfinite(b)
            d[fa != fb] = np.inf
            d[~fa & ~fb] = 0.0                      # both broken: the count columns say how
            counts = self.is_count
            if counts.any():
                ca, cb = a[:, counts] > 0, b[:, counts] > 0
                d[:, counts] = np.where(ca != cb, np.inf, 0.0)
            ld = np.log10(np.maximum(d, ZERO))
        if miss is not None:
            ld[miss] = np.nan
        return ld


def _band(history: np.ndarray) -> tuple:
    """(median, scale) per column of log10 distances; NaN rows filled from the step before."""
    h = history
    if np.isnan(h).any():
        h = _ffill(h)
    med = np.median(h, axis=0)
    with np.errstate(invalid="ignore"):
        mad = np.median(np.abs(h - med), axis=0)
    scale = np.maximum(1.4826 * np.nan_to_num(mad, nan=0.0, posinf=0.0), SCALE_FLOOR)
    return med, scale


def _ffill(x: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(x)
    idx = np.where(ok, np.arange(len(x))[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    return x[idx, np.arange(x.shape[1])[None, :]]


def compare_streams(target, golden, *, sigma: float = SIGMA) -> RankComparison:
    """Compare one rank of two runs; see the module docstring for the rule."""
    return _Scan(_Pair(target, golden), target, golden, sigma).run()


class _Scan:
    """compare_streams, block by block: a block's rows are judged at once against the band of
    the block before; only rows with a candidate are looked at one by one."""

    def __init__(self, pair: _Pair, target, golden, sigma: float):
        self.pair, self.target, self.golden, self.sigma = pair, target, golden, sigma
        self.n = len(pair.steps)
        self.floor = relevance_floor(target.compute_dtype, golden.compute_dtype)
        self.log_floor = math.log10(self.floor)
        self.log_prior = math.log10(min(100 * self.floor, 0.1))
        self.width = block_size(self.n)
        slots = pair.slots
        # Before any history, only forward and backward numbers can depart (on the dtype's
        # prior): a parameter whose gradient is noise (an attention key bias) gets a random
        # Adam update from the first step on, in any two runs; its band has to be learned.
        self.priored = np.array([s.phase in ("forward", "backward") for s in slots], dtype=bool)
        # Optimizer state and parameter norms integrate every earlier step (an EMA, a running
        # sum): their distance grows smoothly and cannot jump where a fault starts, except
        # through the update, which is judged itself. They tell how far a departure spread.
        self.origin = np.array([s.phase != "optimizer" or s.quantity == "update_norm"
                                for s in slots], dtype=bool)
        self.result = RankComparison(target.rank, None, steps=self.n, floor=self.floor)
        self.exact_all = np.ones(len(slots), dtype=bool)   # bitwise equal in every block so far

    def run(self) -> RankComparison:
        pair, width, n = self.pair, self.width, self.n
        band: Optional[tuple] = None   # (median, scale, slope, centre, exact, (first, last step))
        previous = None          # (median, centre) of the block before the band's block
        for start in range(0, n, width):
            stop = min(n, start + width)
            ld = pair.distance(np.arange(start, min(n, stop + PERSIST)))
            if start == 0:       # the first block learns from every earlier step
                for t in range(stop):
                    row_band = None
                    if t >= MIN_HISTORY:
                        med, scale = _band(ld[:t])
                        row_band = (med, scale, None, 0.0, np.all(ld[:t] <= math.log10(ZERO), axis=0),
                                    (int(pair.steps[0]), int(pair.steps[t - 1])))
                    if self._judge(ld, t, 0, row_band):
                        return self._finish()
            else:
                med, scale, slope, centre = cast(tuple, band)[:4]   # set by the first block
                expect = med if slope is None else \
                    med + slope * (np.arange(start, stop)[:, None] - centre)
                block = ld[:stop - start]
                with np.errstate(invalid="ignore"):
                    z = (block - expect) / scale
                for i in self._rows_to_judge(block, z, start):
                    if self._judge(ld, start + i, start, band, z[i]):
                        return self._finish()
            if stop - start >= MIN_HISTORY:
                block = ld[:stop - start]
                if band is not None and start > 0:
                    previous = (band[0], band[3])
                med, scale = _band(block)
                exact = np.all(block <= math.log10(ZERO), axis=0)
                self.exact_all &= exact
                centre = (start + stop - 1) / 2
                slope = None
                if previous is not None:
                    with np.errstate(invalid="ignore"):
                        slope = np.nan_to_num(np.maximum((med - previous[0]) / (centre - previous[1]),
                                                         0.0), nan=0.0, posinf=0.0)
                band = (med, scale, slope, centre, exact,
                        (int(pair.steps[start]), int(pair.steps[stop - 1])))
        return self._finish()

    def _rows_to_judge(self, block: np.ndarray, z: np.ndarray, start: int) -> np.ndarray:
        """Rows of a block holding a candidate; tracks the largest excursion seen on the way."""
        with np.errstate(invalid="ignore"):
            relevant = self.origin & (block >= self.log_floor) & np.isfinite(z)
            near = np.where(relevant, z, -np.inf)
            cand = ((z >= self.sigma) & (block >= self.log_floor)) | \
                (self.pair.is_count & np.isinf(block))
        if near.size:
            i = int(np.argmax(near.max(axis=1)))
            self._track(near[i], start + i)
        return np.flatnonzero((cand & self.origin).any(axis=1))

    def _judge(self, ld, t: int, start: int, band, z=None) -> bool:
        """Judge step t; True when it departs (the result is then filled in)."""
        pair, sigma = self.pair, self.sigma
        row = ld[t - start]
        with np.errstate(invalid="ignore"):
            if band is None:
                z = np.where((row >= self.log_prior) & self.priored, np.inf, 0.0)
                expect = scale = None
            else:
                med, scale, slope, centre = band[:4]
                expect = med if slope is None else med + slope * (t - centre)
                if z is None:
                    z = (row - expect) / scale
            cand = (z >= sigma) & (row >= self.log_floor)
            cand |= pair.is_count & np.isinf(row)
            if band is not None:
                near = np.where(self.origin & (row >= self.log_floor) & np.isfinite(z), z, -np.inf)
                self._track(near, t)
        if not (cand & self.origin).any():
            return False
        columns: np.ndarray = np.flatnonzero(cand)
        confirmed = [j for j in columns if pair.is_count[j] or
                     _persists(ld, t - start, j, expect, scale, sigma)]
        if not any(self.origin[j] for j in confirmed):
            return False
        exact = band[4] if band is not None else None
        base = band[5] if band is not None else None
        departures = [_departure(pair, t, j, row[j], z[j], base,
                                 bool(exact[j]) if exact is not None else False, self.result.rank)
                      for j in confirmed]
        if exact is not None:   # equal since the first step: say so, up to the step before
            first_step, before = int(pair.steps[0]), int(pair.steps[t - 1])
            here = np.all(ld[:t - start] <= math.log10(ZERO), axis=0)
            departures = [d if not (d.exact_before and self.exact_all[j] and here[j]) else
                          _replace(d, baseline=(first_step, before))
                          for d, j in zip(departures, confirmed)]
        departures.sort(key=lambda d: (not self.origin[pair.where[d.slot.column]],
                                       phase_rank(d.phase), d.slot.position))
        self.result.first, self.result.spread = departures[0], departures[1:]
        self.result.verdict = "parted"
        return True

    def _track(self, near: np.ndarray, t: int) -> None:
        if not near.size:
            return
        j = int(np.argmax(near))
        if near[j] > self.result.closest.get("sigma", -np.inf):
            self.result.closest = {"sigma": float(near[j]), "step": int(self.pair.steps[t]),
                                   "column": self.pair.slots[j].column}

    def _finish(self) -> RankComparison:
        result = self.result
        result.drift = _drift(self.target, self.golden, self.floor)
        if result.first is None:
            result.verdict = "drift" if result.drift.get("loss_end", 0.0) > max(self.floor, 1e-4) \
                else "agree"
        return result


def _persists(ld: np.ndarray, i: int, j: int, expect, scale, sigma: float) -> bool:
    """The departure of column j at row i mostly stays out over the next PERSIST rows."""
    after = ld[i + 1:i + 1 + PERSIST, j]
    after = after[~np.isnan(after)]
    if not len(after):
        return True         # the last recorded step: nothing to wait for
    if expect is None:
        return bool(np.median(after) >= ld[i, j] - 1.0)
    return bool(np.median((after - expect[j]) / scale[j]) >= sigma / 2)


def _departure(pair: _Pair, t: int, j: int, ld: float, z: float, base, exact: bool,
               rank: int) -> Departure:
    a, b, _ = pair.values(np.array([t]))
    d = math.inf if math.isinf(ld) else 10.0 ** ld
    return Departure(int(pair.steps[t]), pair.slots[j], d, float(z), base, exact,
                     float(a[0, j]), float(b[0, j]), rank)


def _drift(target, golden, floor: float) -> dict:
    """How far apart the losses are at the start and at the end (relative)."""
    pair = _Pair(target, golden, columns={"loss"})
    if not pair.slots:
        return {}
    n = len(pair.steps)
    k = min(n, block_size(n))
    ld = pair.distance(np.arange(n))[:, 0]
    with np.errstate(all="ignore"):
        head, tail = np.nanmedian(ld[:k]), np.nanmedian(ld[-k:])
    to_rel = lambda x: 0.0 if not np.isfinite(x) or x <= math.log10(ZERO) else float(10.0 ** x)
    return {"loss_start": to_rel(head), "loss_end": to_rel(tail), "floor": floor,
            "steps": [int(pair.steps[0]), int(pair.steps[-1])]}


def distance_series(target, golden, column: str) -> tuple:
    """(steps, relative difference) of one column over the common steps, for the page's chart."""
    pair = _Pair(target, golden, columns={column})
    if not pair.slots:
        return pair.steps, np.full(len(pair.steps), np.nan)
    ld = pair.distance(np.arange(len(pair.steps)))[:, 0]
    with np.errstate(all="ignore"):
        return pair.steps, np.where(ld <= math.log10(ZERO), 0.0, 10.0 ** ld)
