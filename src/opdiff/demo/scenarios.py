"""The demo's stories, each an honest run of the real pipeline: capture -> store -> compare -> report.

Every scenario trains one of `models.py`'s tiny models on CPU, records it with opdiff, runs the
analysis a user would run, and checks the answer against the truth it planted:

- `iadd` (seed 000): a 3D-ResNet whose `+=` is slightly wrong in one residual block;
- `lstm-backward` (seed 001): an LSTM whose backward is wrong while its forward is right;
- `fp16-overflow` (seed 000's first check): fp16 autocast overflows in a hand-written softmax;
- `bf16-healthy`: bf16 autocast against fp32: small differences everywhere, no op to blame.
"""
from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, cast

import torch

# The stories use opdiff's public API the way a user's training script does.
import opdiff
from opdiff.testing import inject_fault

from ..store.schema import Phase, record_name
from . import models
from .story import Story

if TYPE_CHECKING:
    from ..comparison.result import CompareResult
    from ..overflow.result import OverflowResult

SEED = 1234
STEPS = 2              # training steps per run; step 0 is recorded
LEARNING_RATE = 0.05
FAULT_SIZE = 1e-3      # relative size of the planted faults (fp32 runs; opdiff must find 1e-4)
# The last residual block: its output reaches the loss without a BatchNorm that would normalise a
# uniformly scaled activation back to what golden computes, so the fault also moves the loss.
FAULTY_BLOCK = 2


@dataclass
class DemoResult:
    """What one demo run did and found.

    compare: the CompareResult of target against golden (None for fp16-overflow).
    overflow: the offline overflow analysis (fp16-overflow only); online_origin: the message
        training stopped with under task="overflow_check".
    expected: the op the scenario planted (None when nothing was planted; wrong-weights:
        "parameter <FQN>", dropout: the random op); found: whether the pipeline's answer is that
        (for bf16-healthy: that no op was blamed).
    """
    scenario: str
    output: Path
    compare: Optional["CompareResult"] = None
    overflow: Optional["OverflowResult"] = None
    online_origin: Optional[str] = None
    expected: Optional[str] = None
    found: bool = False
    losses: dict = field(default_factory=dict)     # {"golden": [...], "target": [...]}
    files: dict = field(default_factory=dict)      # label -> path
    seconds: float = 0.0

    @property
    def culprit(self) -> Optional[str]:
        """The op the pipeline blamed: the first divergence or the overflow origin (None: none)."""
        if self.compare is not None and self.compare.first_divergence is not None:
            return self.compare.first_divergence.name
        if self.overflow is not None and self.overflow.origin is not None:
            return self.overflow.origin.name
        return None


# -- runs ----------------------------------------------------------------------------------------

def seeded_resnet(softmax_scale: float | None = None):
    """Seed everything, build the 3D-ResNet and its batch: identical on every call, as two
    processes of the user's would be after `opdiff.seed_all`."""
    opdiff.seed_all(SEED)
    model = models.ResNet3d(softmax_scale=softmax_scale)
    x = torch.randn(2, 3, 8, 16, 16)
    labels = torch.randint(0, 4, (2,))
    return model, (x, labels)


def seeded_lstm():
    opdiff.seed_all(SEED)
    model = models.LstmClassifier()
    return model, (torch.randn(4, 12, 6), torch.randint(0, 4, (4,)))


def train(model, batch, dump_path=None, *, task="tensor", fault=None, autocast=None,
          probabilities=False, steps=STEPS) -> list:
    """Train `steps` SGD steps, recording step 0 into `dump_path`; returns the losses.

    fault: inject_fault arguments, planted afresh in every step (a broken kernel stays broken).
    autocast: a dtype to run the forward under torch.autocast("cpu", dtype).
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)
    dbg = None
    if dump_path is not None:
        dbg = opdiff.PrecisionDebugger(dump_path=str(dump_path), task=task, level="mix", step=[0])
    x, labels = batch
    losses = []
    try:
        for _ in range(steps):
            planted = inject_fault(**fault) if fault else nullcontext()
            with planted:  # entered before the debugger starts: the fault sits below the recorder
                if dbg is not None:
                    dbg.start(model)
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=autocast) if autocast else nullcontext():
                    output = model(x)
                loss = models.classification_loss(output, labels, probabilities)
                loss.backward()
                optimizer.step()
                if dbg is not None:
                    dbg.stop()
                    dbg.step()
            if fault and cast(inject_fault, planted).hits != 1:
                raise RuntimeError(f"the fault planted on {fault['op']} call {fault['call']} fired "
                                   f"{cast(inject_fault, planted).hits} times in a training step instead of once")
            losses.append(loss.item())
    finally:
        if dbg is not None:
            dbg.stop()
    return losses


def _losses(values) -> str:
    return " → ".join(f"{v:.6f}" for v in values)


def _count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _differing(result) -> tuple[int, int]:
    """(tensors whose error is above zero, tensors measured)."""
    measured = [r for r in result.rows if r.error is not None and not math.isnan(r.error)]
    return sum(1 for r in measured if r.error > 0), len(measured)


def _compare(out: Path, story: Story):
    from ..api import compare
    from ..report.console import print_result

    with story.working("comparing the dumps op by op"):
        result = compare(out / "dump" / "target", out / "dump" / "golden", output_path=out,
                         progress=False)
    differ, measured = _differing(result)
    story.step(f"Compared target with golden: {measured} tensors lined up op by op, {differ} "
               f"of them differ.")
    story.verdict(print_result, result)
    return result


def _compare_files(out: Path, result) -> dict:
    files = {"dumps": out / "dump"}
    labels = {"csv": "CSV", "summary": "summary.json", "html": "report.html"}
    files.update({labels.get(k, k): Path(v) for k, v in result.files.items()})
    return files


# -- the stories ---------------------------------------------------------------------------------

def play_iadd(out: Path, story: Story) -> DemoResult:
    story.title("opdiff demo — a 3D-ResNet whose `+=` kernel is slightly wrong on the new device",
                "seed 000: the loss drifts after porting a 3D-ResNet; the culprit is "
                "`out += residual`")
    model, batch = seeded_resnet()
    blocks = len(model.layers)
    story.step(f"Built a 3D-ResNet ({blocks} residual blocks, {_count_params(model):,} parameters) "
               f"with opdiff.seed_all({SEED}) so both runs start from the same weights and data.")
    with story.working("training the golden run"):
        golden = train(model, batch, out / "dump" / "golden")
    story.step(f"Golden run: {STEPS} training steps in fp32 on CPU, step 0 recorded (level mix, "
               f"full tensors).", f"loss {_losses(golden)}")
    fault = dict(op="Tensor.__iadd__", call=FAULTY_BLOCK, phase=Phase.FORWARD, scale=1 + FAULT_SIZE)
    model, batch = seeded_resnet()
    with story.working("training the target run"):
        target = train(model, batch, out / "dump" / "target", fault=fault)
    story.step(f"Target run: the same steps on a simulated device whose `+=` is off by "
               f"{FAULT_SIZE:g} (relative) in residual block layers.{FAULTY_BLOCK}, planted with "
               f"opdiff.testing.inject_fault.", f"loss {_losses(target)}: the runs part ways")
    result = _compare(out, story)
    expected = record_name("Tensor.__iadd__", Phase.FORWARD, FAULTY_BLOCK)
    return _planted_fault_result("iadd", out, story, result, expected, golden, target)


def _planted_fault_result(name: str, out: Path, story: Story, result, expected: str, golden,
                          target, why: str = "") -> DemoResult:
    """Check that the compare named the planted op, say so, and package the scenario's result."""
    fd = result.first_divergence
    found = fd is not None and fd.name == expected
    story.check(found, f"opdiff named the planted fault, {expected}{why}" if found else
                f"opdiff did not name the planted fault {expected}")
    return DemoResult(name, out, compare=result, expected=expected, found=found,
                      losses={"golden": golden, "target": target},
                      files=_compare_files(out, result))


def play_lstm_backward(out: Path, story: Story) -> DemoResult:
    story.title("opdiff demo — an LSTM whose backward is wrong while its forward is right",
                "seed 001: 'lstm backward: inputs normal, outputs abnormal'")
    model, batch = seeded_lstm()
    story.step(f"Built an LSTM sequence classifier ({_count_params(model):,} parameters) with "
               f"opdiff.seed_all({SEED}).")
    with story.working("training the golden run"):
        golden = train(model, batch, out / "dump" / "golden")
    story.step(f"Golden run: {STEPS} training steps in fp32 on CPU, step 0 recorded (level mix, "
               f"full tensors, forward and backward).", f"loss {_losses(golden)}")
    fault = dict(op="VF.lstm", call=0, phase=Phase.BACKWARD, scale=1 + FAULT_SIZE)
    model, batch = seeded_lstm()
    with story.working("training the target run"):
        target = train(model, batch, out / "dump" / "target", fault=fault)
    story.step(f"Target run: the same steps on a simulated device whose LSTM backward kernel "
               f"scales its gradients by 1 + {FAULT_SIZE:g}; its forward is exact.",
               f"loss {_losses(target)}: step 0 agrees (the forward is right), step 1 does not")
    result = _compare(out, story)
    expected = record_name("VF.lstm", Phase.BACKWARD, 0)
    return _planted_fault_result("lstm-backward", out, story, result, expected, golden, target,
                                 ": the LSTM's backward, not its forward")


def play_bf16_healthy(out: Path, story: Story) -> DemoResult:
    story.title("opdiff demo — bf16 autocast against fp32: different numbers, nothing broken",
                "a healthy precision change must not be reported as a bug")
    model, batch = seeded_resnet()
    story.step(f"Built the 3D-ResNet ({_count_params(model):,} parameters) with "
               f"opdiff.seed_all({SEED}).")
    with story.working("training the golden run"):
        golden = train(model, batch, out / "dump" / "golden")
    story.step(f"Golden run: {STEPS} training steps in fp32, step 0 recorded.",
               f"loss {_losses(golden)}")
    model, batch = seeded_resnet()
    with story.working("training the target run"):
        target = train(model, batch, out / "dump" / "target", autocast=torch.bfloat16)
    story.step('Target run: the same steps under torch.autocast("cpu", dtype=torch.bfloat16); '
               "no fault planted.", f"loss {_losses(target)}")
    result = _compare(out, story)
    found = result.first_divergence is None
    story.check(found, "opdiff blamed no op: bf16's rounding explains every difference" if found
                else f"opdiff blamed {result.first_divergence.name} in a healthy run")
    return DemoResult("bf16-healthy", out, compare=result, expected=None, found=found,
                      losses={"golden": golden, "target": target},
                      files=_compare_files(out, result))


def play_fp16_overflow(out: Path, story: Story) -> DemoResult:
    from ..overflow import analyze
    from ..overflow.console import print_overflow

    story.title("opdiff demo — fp16 autocast overflows: where was the inf born?",
                "seed 000's first check: is there an overflow, and in which op?")
    scale = 100.0
    model, batch = seeded_resnet(softmax_scale=scale)
    story.step(f"Built the 3D-ResNet with a hand-written softmax (logit scale {scale:g}) and "
               f"opdiff.seed_all({SEED}); fp32 training is fine.")
    online_dir = out / "dump" / "overflow_check"
    online = None
    with story.working("training under overflow_check"):
        try:
            train(copy.deepcopy(model), batch, online_dir, task="overflow_check",
                  autocast=torch.float16, probabilities=True)
        except opdiff.OverflowDetected as exc:
            online = str(exc)
    story.step('Trained under torch.autocast("cpu", dtype=torch.float16) with '
               'PrecisionDebugger(task="overflow_check", overflow_nums=1):',
               f"training stopped: {online}" if online else "training finished without overflow")
    stats_dir = out / "dump" / "statistics"
    with story.working("recording statistics and analysing them"):
        train(model, batch, stats_dir, task="statistics", autocast=torch.float16,
              probabilities=True, steps=1)
        result = analyze(stats_dir)
        overflow_json = result.write_json(out)
    story.step("Recorded the same step as statistics and analysed the dump offline "
               "(opdiff overflow):")
    story.verdict(print_overflow, result)
    expected = record_name("Torch.exp", Phase.FORWARD, 0)
    origin = result.origin
    found = origin is not None and origin.name == expected and online is not None \
        and expected in online
    story.check(found, f"online check and offline analysis agree: the inf is born in {expected}, "
                       f"not downstream" if found else
                f"the overflow origin was not {expected} in both checks")
    files = {"online dump": online_dir, "statistics dump": stats_dir,
             "overflow.json": overflow_json}
    return DemoResult("fp16-overflow", out, overflow=result, online_origin=online,
                      expected=expected, found=found, files=files)
