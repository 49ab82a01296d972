"""trend: read opdiff.Monitor streams and say *which step* and *which part of the model*.

    import opdiff.trend
    result = opdiff.trend.trend("./mon/npu", "./mon/gpu", output="out")   # two runs
    result.first_divergence.step, result.first_divergence.module          # 412, "blocks.7.mlp"
    result = opdiff.trend.trend("./mon/npu", output="out")                # one run: alerts
    result.alerts[0].kind, result.alerts[0].step, result.alerts[0].module

Two runs: steps and modules are aligned by name, rank by rank; the first step where a quantity
leaves the band of normal drift between the runs (learned from the earlier steps and the
dtype: divergence.py) is where they part, and within it the first module in forward order, then
backward, then parameter gradients and the optimizer. One run: where inf/NaN first appears and
where spikes start (alerts.py). OUT receives summary.json, trend.html (curves) and, when
something was found, next_dump.json for `opdiff.PrecisionDebugger(config_path=...)`.
"""
from __future__ import annotations

import logging
from typing import Optional

from .reader import Run, Stream, read_run, read_stream
from .result import TrendResult

log = logging.getLogger("opdiff")

__all__ = ["trend", "read_run", "read_stream", "Run", "Stream", "TrendResult"]


def trend(target, golden=None, output=None, *, sigma: Optional[float] = None,
          html: bool = True) -> TrendResult:
    """Analyse one run (alerts) or two (where they part); write OUT's files when `output` is given.

    sigma: how many MADs beyond the learned drift a step must lie to part the runs (default 6),
    also the spike threshold for one run.
    """
    from ..environment import diff as environment_diff
    from .alerts import SIGMA as ALERT_SIGMA
    from .alerts import find_alerts
    from .divergence import SIGMA, compare_streams
    from .next_dump import next_dump_config, write_next_dump

    target_run = read_run(target)
    golden_run = read_run(golden) if golden is not None else None
    result = TrendResult(str(target), str(golden) if golden is not None else None)
    alerts = []
    for _rank, stream in sorted(target_run.ranks.items()):
        alerts += _tagged(find_alerts(stream, sigma=sigma or ALERT_SIGMA),
                          "target" if golden_run else None)
    result.steps["target"] = len(target_run.first.steps)
    if golden_run is None:
        result.alerts = alerts
        result.verdict = "alert" if result.problems else "clean"
        finding = result.problems[0] if result.problems else next(
            (a for a in alerts if a.kind == "spike"), None)
        if finding is not None:
            stream = target_run.ranks[finding.rank]
            task = "overflow_check" if finding.kind in ("nan", "inf") else "statistics"
            step = finding.origin_step if finding.origin_step is not None else finding.step
            result.next_dump = next_dump_config(step, finding.module,
                                                stream.module_types.get(finding.module),
                                                finding.rank, task=task)
    else:
        for _rank, stream in sorted(golden_run.ranks.items()):
            alerts += _tagged(find_alerts(stream, sigma=sigma or ALERT_SIGMA), "golden")
        result.alerts = sorted(alerts, key=lambda a: (a.step, a.run or ""))
        result.steps["golden"] = len(golden_run.first.steps)
        common = sorted(set(target_run.ranks) & set(golden_run.ranks))
        result.only_in = {"target": sorted(set(target_run.ranks) - set(common)),
                          "golden": sorted(set(golden_run.ranks) - set(common))}
        if not common:
            from ..errors import StreamError
            raise StreamError(f"{target} has ranks {sorted(target_run.ranks)} and {golden} has "
                              f"ranks {sorted(golden_run.ranks)}: none in common")
        for rank in common:
            result.ranks[rank] = compare_streams(target_run.ranks[rank], golden_run.ranks[rank],
                                                 sigma=sigma or SIGMA)
        result.steps["common"] = result.ranks[common[0]].steps
        first = min(result.ranks.values(), key=lambda c: c.key())
        if first.first is not None:
            result.first_divergence = first.first
            result.verdict = "parted"
            d = first.first
            stream = target_run.ranks[d.rank]
            result.next_dump = next_dump_config(d.step, d.module,
                                                stream.module_types.get(d.module), d.rank)
        else:
            result.verdict = "drift" if any(c.verdict == "drift" for c in result.ranks.values()) \
                else "agree"
        result.environment_diff = environment_diff(
            target_run.first.meta.get("environment") or {},
            golden_run.first.meta.get("environment") or {})
    if output is not None:
        # The output directory as every opdiff command has it (`opdiff.report.outputs`): held,
        # what an earlier run provably wrote there (a next_dump.json this run does not find)
        # removed, nothing else; a summary.json opdiff did not write is refused.
        from ..report import outputs
        keep = [p for p in (target, golden) if p is not None]
        with outputs.session(output, keep=keep) as out:
            names = (["next_dump.json"] if result.next_dump is not None else []) + \
                ["summary.json"] + (["trend.html"] if html else [])
            outputs.remember(out, [out / n for n in names])
            if result.next_dump is not None:
                result.files["next_dump.json"] = str(write_next_dump(result.next_dump, out))
            result.files["summary.json"] = str(out / "summary.json")
            if html:
                from .html import write_html
                result.files["trend.html"] = str(write_html(result, target_run, golden_run,
                                                            out / "trend.html"))
            result.write_summary(out)
        result.output = out
    return result


def _tagged(alerts: list, run: Optional[str]) -> list:
    if run is None:
        return alerts
    from dataclasses import replace
    return [replace(a, run=run) for a in alerts]
