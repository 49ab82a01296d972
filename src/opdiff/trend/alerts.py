"""One run on its own: where inf/NaN first appears, and where loss and gradient spikes start.

    alerts = find_alerts(stream)        # [Alert] in step order
    alerts[0].kind, alerts[0].step, alerts[0].module, alerts[0].reason

inf/NaN: the first step holding any, and in it the first place in causal order (a module's
output in forward order, the loss, output gradients in backward order, parameter gradients,
the optimizer's results). With a GradScaler, a step whose forward was finite and whose gradients
were not is the scaler doing its job: reported as "scaler_skip", and the search goes on.

Spikes: the loss or the global gradient norm against the run's own recent past, in log10 units:
`sigma` MADs above the median of the previous `window` steps and at least `ratio` times it; or
a module's activation or gradient norm `MODULE_RATIO` times the median of the previous block of
steps (an activation that blows up and is normalised away before the loss sees it). For each
spike, the module where it starts is the first place in causal order, over that step and the
two before it, that spikes against its own past.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .divergence import _ffill
from .layout import AtSlot, Slot, causal_order, phase_rank

SIGMA = 6.0
WINDOW = 50
RATIO = 2.0
ORIGIN_RATIO = 1.5
MODULE_RATIO = 10.0
MAX_SPIKES = 20
MAD_FLOOR = 0.01            # decades


@dataclass(frozen=True)
class Alert(AtSlot):
    """inf/NaN, a spike, or a step the loss scaler skipped."""

    kind: str                   # "nan" | "inf" | "spike" | "scaler_skip"
    step: int
    slot: Slot
    reason: str
    rank: int = 0
    sigma: Optional[float] = None
    origin_step: Optional[int] = None
    run: Optional[str] = None   # "target" / "golden" when two runs were given

    def to_dict(self) -> dict:
        out = {"kind": self.kind, **self.place_dict(self.reason)}
        if self.sigma is not None:
            out["sigma"] = self.sigma if math.isfinite(self.sigma) else repr(self.sigma)
        if self.origin_step is not None:
            out["origin_step"] = self.origin_step
        if self.run is not None:
            out["run"] = self.run
        return out


def find_alerts(stream, *, sigma: float = SIGMA, window: int = WINDOW,
                ratio: float = RATIO) -> list:
    """inf/NaN onset (and scaler-skipped steps before it), then spikes, sorted by step."""
    slots = causal_order(stream)
    alerts = nonfinite_alerts(stream, slots)
    stop = next((a.step for a in alerts if a.kind in ("nan", "inf")), None)
    alerts += spike_alerts(stream, slots, sigma=sigma, window=window, ratio=ratio, before=stop)
    return sorted(alerts, key=lambda a: (a.step, a.kind != "nan" and a.kind != "inf"))


# -- inf / NaN -----------------------------------------------------------------------------------

def _bad_matrix(stream, slots: list, rows: np.ndarray) -> np.ndarray:
    """rows x slots: True where that slot shows inf/NaN. Modules with count columns are judged
    by their counts (a norm can overflow float32 while every value is finite)."""
    counted = {s.name for s in slots if s.is_count}
    cols = np.array([stream.index(s.column) for s in slots], dtype=np.int64)
    v = stream.values[np.ix_(rows, cols)]
    is_count = np.array([s.is_count for s in slots], dtype=bool)
    judged_by_counts = np.array([(not s.is_count) and s.name in counted and
                                 s.quantity in ("fwd_norm", "fwd_max", "bwd_norm") for s in slots])
    with np.errstate(invalid="ignore"):
        bad = np.where(is_count[None, :], v > 0, ~np.isfinite(v))
    if stream.missing is not None:
        bad &= ~stream.missing[np.ix_(rows, cols)]
    bad[:, judged_by_counts] = False
    return bad


def _suspect_rows(stream, slots: list) -> np.ndarray:
    """Rows that may hold inf/NaN, found without copying the whole stream: a non-finite value
    anywhere, or a count column above zero."""
    with np.errstate(invalid="ignore"):
        rows = ~np.isfinite(stream.values).all(axis=1)
        counts = [stream.index(s.column) for s in slots if s.is_count]
        if counts:
            rows |= (stream.values[:, counts] > 0).any(axis=1)
    return np.flatnonzero(rows)


def nonfinite_alerts(stream, slots: list, max_skips: int = 20) -> list:
    if not slots:
        return []
    suspects = _suspect_rows(stream, slots)
    if not len(suspects):
        return []
    bad = np.zeros((len(stream.steps), len(slots)), dtype=bool)
    bad[suspects] = _bad_matrix(stream, slots, suspects)
    rows: np.ndarray = np.flatnonzero(bad.any(axis=1))
    scaler = stream.has("loss_scale")
    out: list = []
    skips = 0
    for r in rows:
        where = sorted(np.flatnonzero(bad[r]), key=lambda j: (phase_rank(slots[j].phase),
                                                              slots[j].position))
        first = slots[where[0]]
        step = int(stream.steps[r])
        if scaler and all(slots[j].phase != "forward" for j in where):
            skips += 1
            if skips <= max_skips:
                out.append(Alert("scaler_skip", step, first, _skip_reason(stream, r, first),
                                 stream.rank))
            continue
        out.append(_nonfinite_alert(stream, r, first, step))
        break
    return out


def _value(stream, r: int, col: str) -> float:
    return float(stream.values[r, stream.index(col)]) if stream.has(col) else math.nan


def _nonfinite_alert(stream, r: int, first: Slot, step: int) -> Alert:
    nan = _value(stream, r, f"{first.name}:fwd_nan" if first.phase == "forward" else
                 f"{first.name}:bwd_nan")
    inf = _value(stream, r, f"{first.name}:fwd_inf" if first.phase == "forward" else
                 f"{first.name}:bwd_inf")
    if first.is_count or (math.isfinite(nan) and nan + inf > 0):
        kind = "nan" if nan > 0 else "inf"
        counts = f"{nan:.0f} NaN, {inf:.0f} inf"
    else:
        value = _value(stream, r, first.column)
        kind = "nan" if math.isnan(value) else "inf"
        counts = f"{value}"
    typ = stream.module_types.get(first.name)
    who = f"{first.name} ({typ})" if typ else first.name
    if first.phase == "forward" and first.name != "loss":
        reason = (f"{who} is the first module in forward order whose output holds inf/NaN "
                  f"({counts}) at step {step}; every module before it was finite")
    elif first.name == "loss":
        reason = (f"the loss is {counts} at step {step} while every monitored module output "
                  f"was finite: look at the loss function and what follows the last module")
    elif first.phase == "backward":
        reason = (f"the forward of step {step} was finite; the first gradient to hold inf/NaN "
                  f"({counts}) flows into the output of {who}, in backward order")
    elif first.phase == "parameters":
        reason = (f"the gradient of {first.name} is {counts} at step {step}, while the "
                  f"monitored module outputs and output gradients were finite")
    else:
        reason = (f"after optimizer.step() of step {step}, {first.label} of {first.name} is "
                  f"{counts} while its gradient was finite: the update made it")
    return Alert(kind, step, first, reason, stream.rank)


def _skip_reason(stream, r: int, first: Slot) -> str:
    scale = _value(stream, r, "loss_scale")
    return (f"gradients overflowed at step {stream.steps[r]} (first in {first.module}, "
            f"{first.label}) with loss scale {scale:g}; GradScaler skips such a step and lowers "
            f"the scale: expected in fp16 training, not a bug")


# -- spikes --------------------------------------------------------------------------------------

def _rolling_band(logx: np.ndarray, window: int) -> tuple:
    """(median, scale) of the previous `window` values at each position (NaN before enough)."""
    n = len(logx)
    med = np.full(n, np.nan)
    scl = np.full(n, np.nan)
    need = max(10, window // 2)
    if n <= need:
        return med, scl
    padded = np.concatenate([np.full(window - 1, np.nan), logx])
    windows = sliding_window_view(padded, window)[:n - 1]       # values before position i+1
    counts = np.sum(~np.isnan(windows), axis=1)
    with np.errstate(all="ignore"):
        m = np.nanmedian(windows, axis=1) if np.isnan(windows).any() else np.median(windows, axis=1)
        mad = np.nanmedian(np.abs(windows - m[:, None]), axis=1)
    ok = counts >= need
    med[1:][ok] = m[ok]
    scl[1:][ok] = np.maximum(1.4826 * mad[ok], MAD_FLOOR)
    return med, scl


def _log_positive(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.where(np.isfinite(x) & (x > 0), np.log10(np.where(x > 0, x, 1.0)), np.nan)


def spike_alerts(stream, slots: list, *, sigma: float = SIGMA, window: int = WINDOW,
                 ratio: float = RATIO, before: Optional[int] = None) -> list:
    by_column = {s.column: s for s in slots}
    spikes: dict = {}        # row -> (column, z, log10 ratio, (first, last) baseline row)
    for col in ("loss", "grad_norm"):
        if col not in by_column:
            continue
        lx = _log_positive(stream.series(col).astype(np.float64))
        med, scl = _rolling_band(lx, window)
        with np.errstate(invalid="ignore"):
            z = (lx - med) / scl
            hit = (z >= sigma) & (lx - med >= math.log10(ratio))
        for r in np.flatnonzero(hit):
            if r not in spikes or z[r] > spikes[r][1]:
                spikes[r] = (col, float(z[r]), float(lx[r] - med[r]), (max(0, r - window), r - 1))
    for r, found in _module_spikes(stream, slots, sigma, window).items():
        if r not in spikes:
            spikes[r] = found
    events: list = []
    last = -10 ** 9
    for r in sorted(spikes):
        step = int(stream.steps[r])
        if before is not None and step >= before:
            break
        if r - last <= 5:           # the same spike, still high
            last = r
            continue
        last = r
        events.append(r)
        if len(events) >= MAX_SPIKES:
            break
    out = []
    for r in events:
        col, z, lr, (lo, hi) = spikes[r]
        origin, origin_row, oz, olr = _spike_origin(stream, slots, r, window, sigma)
        slot = origin if origin is not None else by_column[col]
        what = {"loss": "the loss", "grad_norm": "the global gradient norm"}.get(
            col, f"{by_column[col].label} of {by_column[col].name}")
        reason = (f"{what} is {10 ** lr:.1f}x the median of steps {stream.steps[lo]}-"
                  f"{stream.steps[hi]} ({z:.0f} sigma) at step {stream.steps[r]}")
        if origin is not None and (origin.column != col or origin_row != r):
            reason += (f"; it starts in {origin.module} ({origin.label} {10 ** olr:.1f}x its "
                       f"median, {oz:.0f} sigma, at step {stream.steps[origin_row]})")
        elif origin is not None:
            reason += ", the first place in causal order to spike"
        out.append(Alert("spike", int(stream.steps[r]), slot, reason, stream.rank, z,
                         int(stream.steps[origin_row]) if origin is not None else None))
    return out


def _median_scale(hist: np.ndarray) -> tuple:
    """Per column median and MAD-scale of log10 values, gaps (NaN) filled from the step before:
    np.nanmedian sorts masked arrays, twenty times slower on long streams."""
    if np.isnan(hist).any():
        hist = _ffill(hist)
    med = np.median(hist, axis=0)
    scl = np.maximum(1.4826 * np.nan_to_num(np.median(np.abs(hist - med), axis=0), nan=0.0),
                     MAD_FLOOR)
    return med, scl


def _module_spikes(stream, slots: list, sigma: float, window: int) -> dict:
    """{row: (column, z, log10 ratio, baseline rows)} where a module's norm jumps MODULE_RATIO times the median
    of the previous block of `window` steps (blocks keep this one pass over the stream)."""
    chosen = [s for s in slots if s.quantity in ("fwd_norm", "bwd_norm")]
    n = len(stream.steps)
    if not chosen or n < 2 * 10:
        return {}
    width = max(10, min(window, n // 2))
    cols = np.array([stream.index(s.column) for s in chosen], dtype=np.int64)
    lx = _log_positive(stream.values[:, cols].astype(np.float64))
    found: dict = {}
    for start in range(width, n, width):
        hist = lx[start - width:start]
        now = lx[start:start + width]
        with np.errstate(all="ignore"):
            med, scl = _median_scale(hist)
            z = (now - med) / scl
            hit = (z >= sigma) & (now - med >= math.log10(MODULE_RATIO))
        for i, j in zip(*np.nonzero(hit)):
            r = start + int(i)
            if r not in found or z[i, j] > found[r][1]:
                found[r] = (chosen[j].column, float(z[i, j]), float(now[i, j] - med[j]),
                            (start - width, start - 1))
    return found


def _spike_origin(stream, slots: list, r: int, window: int, sigma: float):
    """The first slot in causal order, over rows r-2..r, that spikes against its own past."""
    cand = [s for s in slots if not s.is_count and s.column not in ("loss", "grad_norm")]
    if not cand or r < 10:
        return None, r, 0.0, 0.0
    cols = np.array([stream.index(s.column) for s in cand], dtype=np.int64)
    best = None
    for row in range(max(0, r - 2), r + 1):
        lo = max(0, row - window)
        if row - lo < 10:
            continue
        hist = _log_positive(stream.values[lo:row, cols].astype(np.float64))
        now = _log_positive(stream.values[row, cols].astype(np.float64))
        with np.errstate(all="ignore"):
            med = np.nanmedian(hist, axis=0)
            scl = np.maximum(1.4826 * np.nanmedian(np.abs(hist - med), axis=0), MAD_FLOOR)
            z = (now - med) / scl
            hit = (z >= sigma) & (now - med >= math.log10(ORIGIN_RATIO))
        for j in np.flatnonzero(hit):
            key = (row, phase_rank(cand[j].phase), cand[j].position)
            if best is None or key < best[0]:
                best = (key, cand[j], row, float(z[j]), float(now[j] - med[j]))
        if best is not None:
            break       # the earliest row that spikes at all
    if best is None:
        return None, r, 0.0, 0.0
    return best[1], best[2], best[3], best[4]
