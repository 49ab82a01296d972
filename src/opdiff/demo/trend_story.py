"""Scenario `trend` (seed 001, the user's first question): "after porting, the loss converges
worse". Two monitored trainings of a small transformer part at a known step; `opdiff trend`
names the step and the module, writes the page of curves and next_dump.json, and a dump of just
that step and module on both sides, compared op by op, names the kernel.

    import opdiff.demo
    result = opdiff.demo.run("trend", output="./trend-demo")
    result.trend.first_divergence.step, result.trend.first_divergence.module   # 30, blocks.1.act
    result.compare.first_divergence.name                                        # Functional.gelu.1.forward

Torch-free at import (it registers itself in the catalog, which `opdiff demo --list` reads).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, cast

from .catalog import SCENARIOS, Scenario
from .story import Advice, Story

if TYPE_CHECKING:
    from ..trend.divergence import Departure

STEPS = 60
FAULT_STEP = 30
EXPECTED_MODULE = "blocks.1.act"
EXPECTED_OP = "Functional.gelu.1.forward"

TREND_ADVICE = Advice(
    hint="monitor both trainings, every step (a few % of a step):",
    snippet='mon = opdiff.Monitor(model, "./mon/target", optimizer=opt)\n'
            '...loss.backward(); opt.step(); mon.step(loss); opt.zero_grad()',
    then="then find the step and the module, and dump just those:",
    command="opdiff trend ./mon/target ./mon/golden -o ./out")


@dataclass(frozen=True)
class _TrendScenario(Scenario):
    def player(self):
        return play_trend


SCENARIOS["trend"] = _TrendScenario(
    "trend", "001", "two monitored trainings part at step 30: trend names the step and the "
    "module, then the op", "play_trend", TREND_ADVICE)


def play_trend(out: Path, story: Story):
    from ..api import compare
    from ..report.console import print_result
    from ..trend import trend
    from ..trend.console import print_trend
    from .scenarios import DemoResult
    from . import trend_runs

    @dataclass
    class TrendDemoResult(DemoResult):
        trend: Optional[object] = None          # the TrendResult

    story.title("opdiff demo — two trainings part at some step: which step, which module?",
                "seed 001: after porting, the loss converges worse; find the step and the "
                "module before dumping op by op")
    story.step(f"Built a {trend_runs.BLOCKS}-block transformer with opdiff.seed_all("
               f"{trend_runs.SEED}) and trained it {STEPS} steps twice, each watched by "
               f"opdiff.Monitor (every step: loss, gradient norms, every module's activations "
               f"and gradients, every parameter's update).")
    with story.working("training the golden run"):
        golden = trend_runs.train(STEPS, monitor_path=out / "mon" / "golden")
    story.step("Golden run: fp32 on CPU.", f"loss {golden[0]:.4f} → {golden[-1]:.4f}")
    with story.working("training the target run"):
        target = trend_runs.train(STEPS, monitor_path=out / "mon" / "target",
                                  fault_from=FAULT_STEP)
    story.step(f"Target run: the same, on a simulated device whose GELU kernel is off by "
               f"{trend_runs.FAULT_SIZE:g} (relative) in blocks.1 from step {FAULT_STEP} on.",
               f"loss {target[0]:.4f} → {target[-1]:.4f}; the curves look alike")
    result = trend(out / "mon" / "target", out / "mon" / "golden", output=out)
    story.step("Ran opdiff trend on the two monitor streams:")
    story.verdict(print_trend, result)
    fd = result.first_divergence
    found = fd is not None and fd.step == FAULT_STEP and fd.module == EXPECTED_MODULE
    story.check(found, f"trend named step {FAULT_STEP} and {EXPECTED_MODULE}, where the fault "
                       f"was planted" if found else
                f"trend did not name step {FAULT_STEP} and {EXPECTED_MODULE}")
    files = {"monitor streams": out / "mon", "summary.json": out / "summary.json",
             "trend.html": out / "trend.html"}
    op_result = None
    if "next_dump.json" in result.files:
        next_dump = Path(result.files["next_dump.json"])
        files["next_dump.json"] = next_dump
        fd = cast("Departure", fd)   # a next_dump.json is written only for a departure
        with story.working("dumping that step on both sides"):
            for side, fault in (("golden", None), ("target", FAULT_STEP)):
                trend_runs.train(fd.step + 1, fault_from=fault, dump_config=next_dump,
                                 dump_path=out / "dump" / side)
        story.step(f"Dumped only step {fd.step} around {fd.module} on both sides with "
                   f"PrecisionDebugger(config_path='{next_dump.name}'), and compared them:")
        with story.working("comparing op by op"):
            op_result = compare(out / "dump" / "target", out / "dump" / "golden",
                                output_path=out / "compare", progress=False)
        story.verdict(print_result, op_result)
        op = op_result.first_divergence
        op_found = op is not None and op.name == EXPECTED_OP
        story.check(op_found, f"the op-level compare named the planted kernel, {EXPECTED_OP}"
                    if op_found else f"the op-level compare did not name {EXPECTED_OP}")
        found = found and op_found
        files["dumps"] = out / "dump"
        files.update({f"compare {k}": Path(v) for k, v in op_result.files.items()})
    return TrendDemoResult("trend", out, compare=op_result, expected=EXPECTED_OP, found=found,
                           losses={"golden": golden, "target": target}, files=files,
                           trend=result)
