"""fp16 headroom under a real `torch.amp.GradScaler`: the scaler's own values (the scale, 65536
by default, its copies, `scale * loss` and that product's gradient) are far beyond fp16's range on
purpose and are not warned about; the model's own large values still are, each labelled with
its step."""
from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

import opdiff
from opdiff.cli import main
from opdiff.overflow import analyze

from . import models

SCALE = 2.0 ** 16          # GradScaler's default init_scale


@pytest.fixture(scope="module")
def scaler_dump(tmp_path_factory):
    """Two recorded fp32 training steps of ExpNet (exp(12 h) is finite in fp32, beyond fp16,
    and its scaled gradients stay finite) with loss scaling, statistics dump."""
    path = tmp_path_factory.mktemp("scaler") / "dump"
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="statistics", level="mix")
    torch.manual_seed(0)
    scales, losses = models.scaler_training(dbg, SCALE, steps=2, model=models.ExpNet(gain=12.0),
                                            x=torch.randn(4, 8), lr=1e-9, fp16=False)
    assert scales[-1] == SCALE                # no step was skipped: the scale stayed
    return path, losses


def _records(path, step):
    with open(path / f"step{step}" / "rank0" / "records.jsonl") as f:
        return [json.loads(line) for line in f]


def test_the_scalers_values_are_not_warned_about_but_the_models_are(scaler_dump):
    path, losses = scaler_dump
    assert min(losses) * SCALE > 65504        # the scaled loss itself is beyond fp16's range
    records = {r["name"]: r for r in _records(path, 0)}
    scaled = [n for n, r in records.items() if n.startswith("Tensor.__mul__.")
              and n.endswith(".forward") and r["inputs"][1].get("stats", {}).get("max") == SCALE]
    assert len(scaled) == 1                   # scaler.scale(loss)
    assert records[scaled[0]]["outputs"][0]["stats"]["max"] == pytest.approx(losses[0] * SCALE,
                                                                               rel=1e-6)
    result = analyze(path, headroom_factor=2.0)
    warned = [(w.step, w.name) for w in result.headroom]
    for step in (0, 1):                       # the model's own: exp(12 h), every step, labelled
        assert (step, "Torch.exp.0.forward") in warned
    assert not [w for w in result.headroom if w.max_abs == SCALE], warned      # scale copies
    scaled_call = scaled[0].rsplit(".", 1)[0]                                   # scale * loss
    assert not [n for _, n in warned if n.startswith(scaled_call + ".")], warned
    # ... while a record holding the scale is in the dump, and would be warned about on its own
    copies = [n for n, r in records.items() if r.get("kind") == "api" and any(
        o.get("stats", {}).get("max") == SCALE for o in r.get("outputs") or [] if isinstance(o, dict))]
    assert copies


def test_the_overflow_command_labels_each_warning_with_its_step(scaler_dump, tmp_path):
    path, _ = scaler_dump
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["overflow", str(path), "-o", str(tmp_path)]) == 0
    text = out.getvalue()
    assert "step 0: " in text and "step 1: " in text
    assert "Tensor.to.0.forward" not in text        # the scale's copy to the loss's device
    saved = json.loads((tmp_path / "overflow.json").read_text())["headroom"]["warnings"]
    assert {(0, "Torch.exp.0.forward"), (1, "Torch.exp.0.forward")} <= \
        {(w["step"], w["name"]) for w in saved}
    assert all(w["max_abs"] != SCALE for w in saved)
    # the gradients' large values are the scale's doing, and say so with the unscaled size
    grad = next(w for w in saved if w["name"] == "Functional.linear.0.backward" and w["step"] == 0)
    assert f"carries the loss scale {SCALE:g} (unscaled {grad['max_abs'] / SCALE:.4g})" \
        in grad["message"]
    assert not [w for w in saved if w["phase"] == "forward" and "loss scale" in w["message"]]
