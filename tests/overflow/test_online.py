"""task="overflow_check" during training: stop at the op that creates inf/NaN, dump it, and agree
with the offline analysis of a statistics dump of the same run."""
from __future__ import annotations

import gc
import json

import pytest
import torch

import opdiff
from opdiff.overflow import analyze

from . import models

def _records(path):
    files = sorted(path.rglob("records.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


def _run_online(tmp_path, name, overflow_nums=1, steps=1, **kw):
    """Train `steps` steps under overflow_check; returns (debugger, exception or None, dump path)."""
    model, inputs = models.build(name)
    path = tmp_path / f"online_{name}_{overflow_nums}"
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="overflow_check", level="mix",
                                   overflow_nums=overflow_nums, **kw)
    error = None
    try:
        for _ in range(steps):
            dbg.start(model)
            models.step(model, inputs)
            model.zero_grad()
            dbg.stop()
            dbg.step()
    except opdiff.OverflowDetected as exc:
        error = exc
    finally:
        dbg.stop()
    return dbg, error, path


@pytest.mark.parametrize("name,origin,cls", [
    ("exp", "Torch.exp.0.forward", models.ExpNet),
    ("matmul", "Tensor.__matmul__.0.forward", models.MatmulNet),
    ("reciprocal", "Torch.reciprocal.0.backward", models.ReciprocalNet),
])
def test_stops_at_origin_and_dumps_it(tmp_path, name, origin, cls):
    dbg, error, path = _run_online(tmp_path, name)
    assert error is not None, "overflow_nums=1 must stop training"
    message = str(error)
    assert origin in message and "\n" not in message
    phase = origin.rsplit(".", 1)[1]
    assert f"({phase}, step 0)" in message
    records = _records(path)
    # Only the origin is dumped: with its tensors saved, its module and its call site.
    assert [r["name"] for r in records] == [origin]
    rec = records[0]
    assert rec["overflow"] == "origin"
    outs = [d for d in rec["outputs"] if d.get("type") == "tensor"]
    assert outs and all("key" in d for d in outs)
    assert any(d["stats"]["inf"] + d["stats"]["nan"] > 0 for d in outs)
    ins = [d for d in rec["inputs"] if d.get("type") == "tensor"]
    assert all(d["stats"]["inf"] + d["stats"]["nan"] == 0 for d in ins)
    dump = opdiff.store.open_dump(path / "step0" / "rank0")
    saved = dump.tensor(outs[0]["key"])
    assert not torch.isfinite(saved).all()
    line = models.origin_line(cls, name)
    assert dump.stack(rec["stack"])[0]["line"] == line
    # The offline analysis of the online dump, and of a statistics dump of the same run, agree.
    assert analyze(path).origin.name == origin
    stats_path = tmp_path / "stats"
    model, inputs = models.build(name)
    with opdiff.dump(model, str(stats_path), level="mix", task="statistics"):
        models.step(model, inputs)
    offline = analyze(stats_path).origin
    assert (offline.name, offline.phase, offline.location.line) == (origin, phase, line)


@pytest.mark.parametrize("name,cls", [("exp", models.ExpNet), ("reciprocal", models.ReciprocalNet)])
def test_message_names_the_source_line(tmp_path, name, cls):
    _, error, _ = _run_online(tmp_path, name)
    assert f"models.py:{models.origin_line(cls, name)}" in str(error)


def test_minus_one_completes_and_blames_only_origins(tmp_path):
    dbg, error, path = _run_online(tmp_path, "exp", overflow_nums=-1, steps=2)
    assert error is None
    # One origin per step; the linear after exp, the module around it and the backward ops
    # that read exp's inf output are propagation, not new origins.
    for step in ("step0", "step1"):
        assert [r["name"] for r in _records(path / step)] == ["Torch.exp.0.forward"]
        # Every step's dump carries its own call stacks.
        origin = analyze(path / step).origin
        assert origin.location.line == models.origin_line(models.ExpNet, "exp")
    assert [o["name"] for o in dbg.overflows] == ["Torch.exp.0.forward"]   # the last step's
    assert dbg.session.overflow.propagated > 3


def test_minus_one_records_every_step(tmp_path):
    dbg, error, path = _run_online(tmp_path, "exp", overflow_nums=-1, steps=2)
    assert error is None
    names = [r["name"] for r in _records(path)]
    assert names.count("Torch.exp.0.forward") == 2


def test_clean_run_writes_no_alarm(tmp_path):
    dbg, error, path = _run_online(tmp_path, "exp_clean", steps=2)
    assert error is None and dbg.overflows == []
    assert _records(path) == []
    assert analyze(path).status == "clean"


def test_config_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "overflow_check", "dump_path": str(tmp_path / "cfgdump"),
                               "level": "L1", "overflow_check": {"overflow_nums": 1}}))
    model, inputs = models.build("exp")
    dbg = opdiff.PrecisionDebugger(config_path=str(cfg))
    with pytest.raises(opdiff.OverflowDetected, match=r"Torch\.exp\.0\.forward"):
        try:
            dbg.start(model)
            models.step(model, inputs)
        finally:
            dbg.stop()


def test_intentional_mask_is_not_an_alarm(tmp_path):
    dbg, error, _ = _run_online(tmp_path, "masked")
    assert error is None and dbg.overflows == []


def test_loss_scaler_skip_is_not_an_alarm(tmp_path):
    path = tmp_path / "scaler"
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="overflow_check", level="mix",
                                   overflow_nums=1)
    models.scaler_training(dbg, 2.0 ** 40, steps=2)
    assert dbg.overflows == [] and dbg.session.overflow.skipped_by_scaler >= 1
    result = analyze(path)
    assert {s.status for s in result.steps} == {"skipped_by_loss_scaler"}


def test_overflow_does_not_leave_a_debugger_running(tmp_path):
    # The user's loop ends at the exception and never calls stop(); a new debugger must start.
    # (Start from nothing frozen: in the whole suite an earlier test leaves objects frozen, and
    # capture then rightly leaves the freeze alone; which test does is not known yet.)
    gc.unfreeze()
    model, inputs = models.build("exp")
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "a"), task="overflow_check", level="L1")
    dbg.start(model)
    with pytest.raises(opdiff.OverflowDetected):
        models.step(model, inputs)
    # The step is never closed: the objects frozen out of full collections at its start must
    # not stay frozen for the rest of the process.
    assert gc.get_freeze_count() == 0
    model, inputs = models.build("exp_clean")
    with opdiff.dump(model, str(tmp_path / "b"), level="L1"):
        models.step(model, inputs)
    assert analyze(tmp_path / "b").status == "clean"
