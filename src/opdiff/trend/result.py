"""What `opdiff trend` found, in words and as summary.json.

    result = opdiff.trend.trend("./mon/npu", "./mon/gpu", output="out")
    result.first_divergence        # Departure (step, module, quantity, phase, reason, rank) or None
    result.alerts                  # [Alert]: inf/NaN onset, spikes, steps the loss scaler skipped
    result.message                 # "the runs part at step 412, first in blocks.7.mlp (...)"

summary.json: {"first_divergence": null | {"step", "module", "quantity", "phase", "reason",
"rank", ...}, "alerts": [...], "verdict", "message", "ranks", "steps", "drift", "next_dump",
"environment_diff", "target", "golden"}.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..monitor.stream import write_json_atomic
from ..store.records import SCHEMA_VERSION
from .layout import phase_rank

if TYPE_CHECKING:
    from .divergence import Departure

SUMMARY = "summary.json"


@dataclass
class TrendResult:
    target: str
    golden: Optional[str]
    first_divergence: Optional["Departure"] = None
    ranks: dict = field(default_factory=dict)  # rank -> RankComparison (two runs)
    alerts: list = field(default_factory=list)
    verdict: str = "clean"   # two runs: parted | drift | agree; one run: alert | clean
    steps: dict = field(default_factory=dict)
    only_in: dict = field(default_factory=dict)   # ranks only one run has
    environment_diff: list = field(default_factory=list)
    next_dump: Optional[dict] = None
    files: dict = field(default_factory=dict)     # label -> path, after write()
    output: Optional[Path] = None

    @property
    def problems(self) -> list:
        """The inf/NaN alerts (spikes and scaler skips are not failures)."""
        return [a for a in self.alerts if a.kind in ("nan", "inf")]

    @property
    def found(self) -> bool:
        """The runs part, or (one run) inf/NaN appears: what --fail-on-divergence fails on."""
        return self.first_divergence is not None or bool(self.problems)

    @property
    def message(self) -> str:
        if self.golden is not None:
            text = self._two_runs()
        else:
            text = self._one_run()
        if self.next_dump is not None:
            where = self.files.get("next_dump.json")
            text += (f"; to see op by op: PrecisionDebugger(config_path='{where}')" if where else
                     "; write it with -o to get next_dump.json for the op-level dump")
        return text

    def _two_runs(self) -> str:
        first = self.first_divergence
        if first is None:
            drift: dict = next((r.drift for r in self.ranks.values() if r.drift), {})
            if self.verdict == "drift":
                return (f"gradual drift, no step stands out: the loss differs by "
                        f"{_pct(drift.get('loss_end', 0))} at the end "
                        f"({_pct(drift.get('loss_start', 0))} at the start)")
            return (f"the runs agree within their normal drift over {self.steps.get('common', 0)} "
                    f"steps")
        text = f"the runs part at step {first.step}"
        if len(self.ranks) > 1:
            text += f" on rank {first.rank} first"
            later = sorted((r for r in self.ranks.values() if r.first is not None
                            and r.rank != first.rank), key=lambda r: r.key())
            if later:
                text += f" (then rank {later[0].rank} at step {later[0].first.step})"
        text += f", first in {first.module} ({first.reason})"
        spread = _spread(self.ranks[first.rank].spread, first)
        if spread:
            text += f", then {spread}"
        return text

    def _one_run(self) -> str:
        problems = self.problems
        spikes = [a for a in self.alerts if a.kind == "spike"]
        skips = [a for a in self.alerts if a.kind == "scaler_skip"]
        parts = []
        if problems:
            a = problems[0]
            parts.append(f"inf/NaN first appears at step {a.step} in {a.module}: {a.reason}")
        if spikes:
            a = spikes[0]
            more = f" ({len(spikes)} spikes in all)" if len(spikes) > 1 else ""
            parts.append(f"a spike at step {a.step}{more}: {a.reason}")
        if skips:
            parts.append(f"the loss scaler skipped {len(skips)} step(s) (expected with fp16)")
        if not parts:
            return f"no inf/NaN and no spike in {self.steps.get('target', 0)} steps"
        return "; ".join(parts)

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {
            "schema_version": SCHEMA_VERSION,
            "first_divergence": first.to_dict() if first is not None else None,
            "alerts": [a.to_dict() for a in self.alerts],
            "verdict": self.verdict,
            "message": self.message,
            "ranks": {str(r): {"first_divergence": c.first.to_dict() if c.first else None,
                               "verdict": c.verdict, "steps": c.steps, "drift": c.drift,
                               "closest": c.closest,
                               "relevance_floor": c.floor}
                      for r, c in sorted(self.ranks.items())},
            "steps": self.steps,
            "only_in": self.only_in,
            "next_dump": self.files.get("next_dump.json"),
            "environment_diff": self.environment_diff,
            "target": self.target,
            "golden": self.golden,
        }

    def write_summary(self, output) -> Path:
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        path = out / SUMMARY
        write_json_atomic(path, self.to_dict())
        return path


def _pct(x: float) -> str:
    return f"{100 * x:.2g}%"


def _spread(others: list, first) -> str:
    """"12 later forward outputs (first blocks.8.norm1), 20 output gradients and 14 parameter
    gradients" from the other departures at the culprit's step."""
    names: dict = {}
    for d in others:
        if d.slot.name == first.slot.name and d.phase == first.phase:
            continue
        bucket = names.setdefault(d.phase, [])
        if d.slot.name not in bucket:
            bucket.append(d.slot.name)
    words = {"forward": "later forward outputs", "backward": "output gradients",
             "parameters": "parameter gradients", "optimizer": "optimizer results"}
    parts = []
    for phase in sorted(names, key=phase_rank):
        found = names[phase]
        part = f"{len(found)} {words[phase]}"
        if len(found) == 1 or phase == "forward":
            part += f" ({found[0]})" if len(found) == 1 else f" (first {found[0]})"
        parts.append(part)
    if len(parts) > 1:
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    return parts[0] if parts else ""
