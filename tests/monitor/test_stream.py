"""The stream on disk: meta.json says what the numbers are, metrics.csv is one line per step
that pandas reads in one call, NaN/inf and "not measured" survive the round trip, and a run
killed with SIGKILL leaves every step up to the last flush."""
from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
import torch

import opdiff
from opdiff.monitor.stream import StreamWriter, format_line
from opdiff.trend import read_run

from .conftest import MODEL_CASES, kill_after, start_python


def _run(path, steps=3, **options):
    model, inputs, loss_fn = MODEL_CASES["transformer"].build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with opdiff.Monitor(model, path, optimizer=opt, **options) as mon:
        for _ in range(steps):
            loss = loss_fn(model(*inputs))
            loss.backward()
            opt.step()
            mon.step(loss)
            opt.zero_grad()
    return model


def test_meta_holds_environment_config_and_forward_order(tmp_path):
    _run(tmp_path)
    meta = json.loads((tmp_path / "rank0" / "meta.json").read_text())
    assert meta["format"] == "opdiff-monitor" and meta["version"] == 1
    assert meta["environment"]["torch"] == torch.__version__
    assert meta["config"]["every"] == 1 and meta["config"]["optimizer"] == "Adam"
    names = [m["name"] for m in meta["modules"]]
    # Forward order: the order modules returned (children before the block that holds them).
    assert names.index("norm1") < names.index("attn") < names.index("fc1") < names.index("fc2")
    assert {m["type"] for m in meta["modules"]} >= {"LayerNorm", "MultiheadAttention", "Linear"}
    back = meta["backward_order"]
    assert back[0] == "drop" and back.index("fc2") < back.index("fc1") < back.index("norm2")
    assert meta["compute_dtype"] == "float32"
    assert {p["name"] for p in meta["parameters"]} == {"norm1.weight", "norm1.bias",
        "attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight",
        "attn.out_proj.bias", "norm2.weight", "norm2.bias", "fc1.weight", "fc1.bias",
        "fc2.weight", "fc2.bias"}


def test_columns_hold_what_the_step_computed(tmp_path):
    model = _run(tmp_path, steps=2)
    stream = read_run(tmp_path).ranks[0]
    head = stream.columns[:4]
    assert head == ["loss", "grad_norm", "lr", "step_time"]
    for q in ("fwd_norm", "fwd_max", "fwd_nan", "fwd_inf", "bwd_norm", "bwd_nan", "bwd_inf"):
        assert stream.has(f"fc1:{q}")
    for q in ("norm", "grad_norm", "update_norm", "exp_avg_norm", "exp_avg_sq_norm"):
        assert stream.has(f"fc1.weight:{q}")
    # The last step's parameter norm and gradient norm are those of the model now.
    w = model.fc1.weight
    assert stream.series("fc1.weight:norm")[-1] == pytest.approx(float(w.detach().norm()), rel=1e-6)
    total = math.sqrt(sum(stream.series(f"{n}:grad_norm")[-1] ** 2 for n, _ in
                          model.named_parameters()))
    assert stream.series("grad_norm")[-1] == pytest.approx(total, rel=1e-5)


def test_pandas_reads_a_stream_in_one_call(tmp_path):
    pandas = pytest.importorskip("pandas")
    _run(tmp_path)
    frame = pandas.read_csv(tmp_path / "rank0" / "metrics.csv")
    stream = read_run(tmp_path).ranks[0]
    assert list(frame["step"]) == [0, 1, 2]
    # The decimals are float32's shortest round trip: exactly the values opdiff reads.
    assert np.array_equal(frame["fc1:fwd_norm"].to_numpy().astype(np.float32),
                          stream.series("fc1:fwd_norm"))


def test_nan_inf_and_not_measured_survive_the_round_trip(tmp_path):
    writer = StreamWriter(tmp_path / "rank0")
    writer.write_meta({"format": "opdiff-monitor", "version": 1, "rank": 0})
    writer.open(["loss", "a:fwd_norm", "a:fwd_nan"])
    writer.append(0, np.array([1.5, 2.0, 0.0]))
    writer.append(1, np.array([np.nan, np.inf, 3.0]))
    writer.append(2, np.array([0.1, -np.inf, 0.0]), np.array([False, False, True]))
    writer.close()
    assert format_line(3, np.array([0.1])) == b"3,0.1\n"          # float32, shortest form
    stream = read_run(tmp_path).ranks[0]
    assert list(stream.steps) == [0, 1, 2]
    v = stream.values
    assert v[0].tolist() == [1.5, 2.0, 0.0]
    assert math.isnan(v[1, 0]) and v[1, 1] == math.inf and v[2, 1] == -math.inf
    assert stream.measured("loss").tolist() == [True, True, True]      # a measured NaN
    assert stream.measured("a:fwd_nan").tolist() == [True, True, False]


KILLED = textwrap.dedent("""
    import sys, time, torch
    import opdiff
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon = opdiff.Monitor(model, sys.argv[1], optimizer=opt)
    x = torch.randn(32, 8)
    progress = open(sys.argv[2], "w")
    for step in range(100000):
        loss = model(x).pow(2).mean()
        loss.backward(); opt.step(); mon.step(loss); opt.zero_grad()
        progress.write(f"{step}\\n"); progress.flush()       # this step is flushed
""")


def test_a_killed_run_keeps_every_step_up_to_the_last_flush(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(KILLED)
    progress = tmp_path / "progress.txt"
    proc = start_python(script, tmp_path / "mon", progress, wait=False)
    done = kill_after(proc, progress, 40, timeout=120)
    stream = read_run(tmp_path / "mon").ranks[0]
    steps = list(stream.steps)
    assert steps == list(range(len(steps)))          # nothing lost, nothing torn
    assert len(steps) >= done[-1] + 1                # every step reported done is there
    assert np.isfinite(stream.series("loss")).all()
    # `opdiff trend` reads it like any other run.
    from opdiff.cli import main
    assert main(["trend", str(tmp_path / "mon")]) == 0


def test_tensorboard_export(tmp_path):
    pytest.importorskip("tensorboard")
    _run(tmp_path, tensorboard=True)
    events = list((tmp_path / "rank0" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "loss" in tags and "fc1/fwd_norm" in tags and "fc1.weight/update_norm" in tags
    assert [e.step for e in acc.Scalars("loss")] == [0, 1, 2]
    # The same numbers as the stream (float32 both), one event per step holding every scalar.
    stream = read_run(tmp_path).ranks[0]
    assert [e.value for e in acc.Scalars("fc1/fwd_norm")] == stream.series("fc1:fwd_norm").tolist()
    assert "fc1/fwd_nan" not in tags


def test_optimizer_state_norms_follow_a_reloaded_state(tmp_path):
    model, inputs, loss_fn = MODEL_CASES["transformer"].build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with opdiff.Monitor(model, tmp_path, optimizer=opt) as mon:
        for step in range(4):
            if step == 2:       # new state tensors (a checkpoint loaded mid-run), scaled by 3
                saved = opt.state_dict()
                for s in saved["state"].values():
                    s["exp_avg"] = s["exp_avg"] * 3
                opt.load_state_dict(saved)
            loss = loss_fn(model(*inputs))
            loss.backward()
            opt.step()
            mon.step(loss)
            opt.zero_grad()
    stream = read_run(tmp_path).ranks[0]
    w = model.fc1.weight
    assert stream.series("fc1.weight:exp_avg_norm")[-1] == \
        pytest.approx(float(opt.state[w]["exp_avg"].norm()), rel=1e-6)
