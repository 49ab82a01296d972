"""Two stories where no op is to blame, each run as two processes like a user's two scripts:

- `wrong-weights`: the target loads a checkpoint converted from golden's whose conversion
  changed one weight element by 1e-2; the compare names the parameter by its FQN and the first
  op that reads it (origin "parameter"), not an op downstream;
- `dropout`: the target script seeds the generator again after building the model, so its
  dropout masks differ; the compare names the dropout call as origin "random" and points to
  opdiff.seed_all, not at an op's arithmetic.
"""
from __future__ import annotations

from pathlib import Path

import torch

from . import models
from .runs import RESEED, SEED, run_sides
from .scenarios import STEPS, DemoResult, _compare, _compare_files, _count_params, _losses, \
    seeded_resnet
from .story import Story

SPOILED = "layers.1.conv2.weight"     # the parameter the conversion gets wrong
SPOILED_AT = (0, 0, 1, 1, 1)          # ... at this element
SPOIL = 1e-2


def convert_checkpoint(golden: Path, converted: Path) -> float:
    """The conversion the story's user wrote: copy every tensor of the checkpoint, except that
    one element of SPOILED comes out 1e-2 too large. Returns that element's golden value."""
    state = torch.load(golden, weights_only=True)
    out = {name: tensor.clone() for name, tensor in state.items()}
    before = float(out[SPOILED][SPOILED_AT])
    out[SPOILED][SPOILED_AT] += SPOIL
    torch.save(out, converted)
    return before


def first_reader(model: torch.nn.Module, fqn: str) -> str:
    """The record name of the op that first reads the conv weight `fqn` (convolutions run in
    the order their modules were registered, in this model)."""
    convs = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Conv3d)]
    return f"Functional.conv3d.{convs.index(fqn.rsplit('.', 1)[0])}.forward"


def play_wrong_weights(out: Path, story: Story) -> DemoResult:
    story.title("opdiff demo — one weight element differs after a checkpoint conversion",
                "no op is wrong: the runs do not start from the same weights")
    model, _ = seeded_resnet()
    ckpt = out / "checkpoint"
    ckpt.mkdir(exist_ok=True)
    torch.save(model.state_dict(), ckpt / "golden.pt")
    before = convert_checkpoint(ckpt / "golden.pt", ckpt / "converted.pt")
    story.step(f"Built the 3D-ResNet ({_count_params(model):,} parameters) with "
               f"opdiff.seed_all({SEED}) and saved its weights to checkpoint/golden.pt.",
               f"A conversion script wrote checkpoint/converted.pt: every tensor copied, except "
               f"{SPOILED}[{', '.join(map(str, SPOILED_AT))}]: {before:.6f} → "
               f"{before + SPOIL:.6f} (off by {SPOIL:g}).")
    with story.working("training the golden and the target run (two processes)"):
        losses = run_sides("wrong-weights", {
            "golden": (out / "dump" / "golden", [str(ckpt / "golden.pt")]),
            "target": (out / "dump" / "target", [str(ckpt / "converted.pt")])})
    golden, target = losses["golden"], losses["target"]
    story.step(f"Golden run, in its own process: loads checkpoint/golden.pt, {STEPS} training "
               f"steps in fp32, step 0 recorded (level mix, full tensors).",
               f"loss {_losses(golden)}")
    story.step("Target run, in another process: the same script, loading "
               "checkpoint/converted.pt; no kernel is faulty.",
               f"loss {_losses(target)}")
    result = _compare(out, story)
    fd = result.first_divergence
    reader = first_reader(model, SPOILED)
    found = fd is not None and (fd.origin, fd.tensor, fd.name) == ("parameter", SPOILED, reader)
    story.check(found, f"opdiff named the converted weight, parameter {SPOILED}, before any op "
                       f"used it (first read by {reader}), and blamed no op" if found else
                f"opdiff did not name parameter {SPOILED} read by {reader} as the origin")
    files = {"checkpoints": ckpt, **_compare_files(out, result)}
    return DemoResult("wrong-weights", out, compare=result, expected=f"parameter {SPOILED}",
                      found=found, losses={"golden": golden, "target": target}, files=files)


def play_dropout(out: Path, story: Story) -> DemoResult:
    story.title("opdiff demo — dropout masks differ because the generator was seeded again",
                "no op is wrong: the random numbers are not the same in the two runs")
    count = _count_params(models.DropoutClassifier())
    story.step(f"A classifier with dropout ({count:,} parameters): both scripts call "
               f"opdiff.seed_all({SEED}), build the model and draw the batch alike.",
               f"The target script then calls torch.manual_seed({RESEED}) again (as a "
               f"data-loading helper might): same weights and data, other dropout masks.")
    with story.working("training the golden and the target run (two processes)"):
        losses = run_sides("dropout", {"golden": (out / "dump" / "golden", []),
                                       "target": (out / "dump" / "target", [])})
    golden, target = losses["golden"], losses["target"]
    story.step(f"Golden run, in its own process: {STEPS} training steps, dropout active, step 0 "
               f"recorded (level mix, full tensors).", f"loss {_losses(golden)}")
    story.step("Target run, in another process: the same steps after the second "
               f"torch.manual_seed({RESEED}).", f"loss {_losses(target)}")
    result = _compare(out, story)
    fd = result.first_divergence
    expected = "Functional.dropout.0.forward"
    found = fd is not None and fd.origin == "random" and fd.name == expected \
        and "opdiff.seed_all" in fd.reason
    story.check(found, f"opdiff named the random origin, {expected}: its generator was in "
                       f"another state, its arithmetic is right" if found else
                f"opdiff did not name {expected} as a random origin")
    return DemoResult("dropout", out, compare=result, expected=expected, found=found,
                      losses={"golden": golden, "target": target},
                      files=_compare_files(out, result))
