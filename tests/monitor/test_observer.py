"""The monitor changes nothing the user computes: parameters after N steps, every gradient and
every loss are bitwise equal to a run without it, and no random generator moves. Its hooks hold
no graph, go away on close(), and a failure of its own never reaches the training loop."""
from __future__ import annotations

import logging
import os
import weakref

import pytest
import torch

import opdiff
from opdiff.errors import ConfigError, OverflowDetected
from opdiff.trend import read_run

from .conftest import MODEL_CASES, TRAINING_FAMILIES

STEPS = 4


def _train(case, path=None, *, optimizer="adam", steps=STEPS, **options):
    """(params, grads per step, losses, rng state) of `steps` steps, monitored into `path`."""
    model, inputs, loss_fn = case.build()
    params = list(model.parameters())
    opt = (torch.optim.Adam(params, lr=1e-2) if optimizer == "adam" else
           torch.optim.SGD(params, lr=1e-2, momentum=0.9))
    mon = opdiff.Monitor(model, path, optimizer=opt, **options) if path else None
    torch.manual_seed(7)        # dropout draws from here, in both runs alike
    grads, losses = [], []
    for _ in range(steps):
        loss = loss_fn(model(*inputs))
        loss.backward()
        opt.step()
        grads.append([p.grad.clone() for p in params])
        if mon is not None:
            mon.step(loss)
        opt.zero_grad()
        losses.append(loss.detach().clone())
    if mon is not None:
        mon.close()
    return [p.detach().clone() for p in params], grads, losses, torch.get_rng_state()


def _bitwise(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.view(-1).view(torch.uint8) if a.numel() else a, b.view(-1).view(torch.uint8) if b.numel() else b)


@pytest.mark.parametrize("family", TRAINING_FAMILIES)
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_parameters_gradients_losses_and_rng_are_bitwise_unchanged(family, optimizer, tmp_path):
    case = MODEL_CASES[family]
    plain = _train(case, optimizer=optimizer)
    watched = _train(case, tmp_path / "mon", optimizer=optimizer)
    for a, b in zip(plain[0], watched[0]):
        assert _bitwise(a, b)
    for step_a, step_b in zip(plain[1], watched[1]):
        assert all(_bitwise(a, b) for a, b in zip(step_a, step_b))
    assert all(_bitwise(a, b) for a, b in zip(plain[2], watched[2]))
    assert torch.equal(plain[3], watched[3])              # no random number drawn by the monitor
    stream = read_run(tmp_path / "mon").ranks[0]
    assert list(stream.steps) == list(range(STEPS))
    # It did measure: the loss it recorded is the loss the run computed.
    assert stream.series("loss").tolist() == [float(l) for l in watched[2]]


def test_the_monitor_itself_draws_no_random_number(tmp_path):
    model, inputs, loss_fn = MODEL_CASES["transformer"].build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mon = opdiff.Monitor(model, tmp_path, optimizer=opt)
    with torch.no_grad():
        out = model(*inputs)       # an evaluation pass: the hooks stay quiet
    loss = loss_fn(model(*inputs))
    loss.backward()
    opt.step()
    state = torch.get_rng_state()
    mon.step(loss)
    mon.close()
    assert torch.equal(state, torch.get_rng_state())
    assert out is not None


def test_hooks_hold_no_graph_and_close_removes_them(tmp_path):
    model, inputs, loss_fn = MODEL_CASES["cnn"].build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = opdiff.Monitor(model, tmp_path, optimizer=opt)
    inner = []       # a weak reference to an activation autograd saves for the backward
    model.conv1.register_forward_hook(lambda m, a, o: inner.append(weakref.ref(o)))
    out = model(*inputs)
    loss = loss_fn(out)
    loss.backward()
    opt.step()
    mon.step(loss)
    ref = weakref.ref(out)
    del out, loss
    assert ref() is None and inner[0]() is None       # the graph and its tensors are gone
    hooked = [m for m in model.modules() if m._forward_hooks and m is not model.conv1]
    assert hooked and all(len(m._forward_hooks) == 1 for m in hooked)
    mon.close()
    assert all(not m._forward_hooks for m in model.modules() if m is not model.conv1)
    assert not opt._optimizer_step_pre_hooks
    mon.step(None)                 # after close: nothing, and no error


def test_every_records_every_nth_step(tmp_path):
    _train(MODEL_CASES["lstm"], tmp_path, steps=7, every=3)
    assert list(read_run(tmp_path).ranks[0].steps) == [0, 3, 6]


def test_modules_filter_names_what_is_watched(tmp_path):
    _train(MODEL_CASES["cnn"], tmp_path, steps=1, modules=["layer1.*"])
    stream = read_run(tmp_path).ranks[0]
    assert stream.modules and all(m.startswith("layer1.") for m in stream.modules)
    with pytest.raises(ConfigError, match="no module"):
        opdiff.Monitor(torch.nn.Linear(2, 2), tmp_path / "x", modules=["nothing*"])


def test_bad_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        opdiff.Monitor("not a model", tmp_path)
    with pytest.raises(ConfigError):
        opdiff.Monitor(torch.nn.Linear(2, 2), tmp_path, every=0)
    with pytest.raises(ConfigError):
        opdiff.Monitor(torch.nn.Linear(2, 2), tmp_path, optimizer=object())


def test_a_full_disk_is_logged_once_and_training_goes_on(tmp_path, caplog):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full to fill the disk")
    case = MODEL_CASES["cnn"]
    path = tmp_path / "mon"
    (path / "rank0").mkdir(parents=True)
    os.symlink("/dev/full", path / "rank0" / "metrics.csv")   # every write: ENOSPC
    plain = _train(case)
    with caplog.at_level(logging.WARNING, logger="opdiff"):
        watched = _train(case, path, steps=STEPS)
    assert all(_bitwise(a, b) for a, b in zip(plain[0], watched[0]))
    stopped = [r for r in caplog.records if "Monitor stopped recording" in r.getMessage()]
    assert len(stopped) == 1 and "No space left" in stopped[0].getMessage()


def test_raise_on_nan_stops_at_the_first_module_with_nan(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = opdiff.Monitor(model, tmp_path, optimizer=opt, raise_on_nan=True)
    x = torch.randn(3, 4)
    for step in range(3):
        if step == 2:
            with torch.no_grad():
                model[1].weight[0, 0] = float("nan")
        try:
            loss = model(x).pow(2).mean()
        except OverflowDetected as exc:
            assert step == 2 and "1 (Linear) at step 2" in str(exc)
            break
        loss.backward()
        opt.step()
        mon.step(loss)
        opt.zero_grad()
    else:
        pytest.fail("OverflowDetected was not raised")
    mon.close()
    assert list(read_run(tmp_path).ranks[0].steps) == [0, 1]


def test_rank_argument_names_the_stream_directory(tmp_path):
    _train(MODEL_CASES["lstm"], tmp_path, steps=1, rank=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank3"]
    assert read_run(tmp_path).ranks[3].rank == 3


def test_watching_every_module_including_in_place_relus_changes_nothing(tmp_path):
    case = MODEL_CASES["cnn"]              # ReLU(inplace=True) right after BatchNorm
    plain = _train(case)
    watched = _train(case, tmp_path, modules=["*"])
    assert all(_bitwise(a, b) for a, b in zip(plain[0], watched[0]))
    assert all(all(_bitwise(a, b) for a, b in zip(x, y)) for x, y in zip(plain[1], watched[1]))
    assert "relu" in read_run(tmp_path).ranks[0].modules
