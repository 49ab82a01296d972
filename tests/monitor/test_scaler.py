"""With a GradScaler: the loss scale is recorded, module gradients are unscaled, and steps the
scaler skips because gradients overflowed are not reported as inf/NaN bugs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import opdiff
from opdiff.trend import read_run, trend


def _train(path, scaler=None, steps=6, loss_factor=1.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon = opdiff.Monitor(model, path, optimizer=opt, scaler=scaler)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        loss = model(x).pow(2).mean() * loss_factor
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        mon.step(loss)
        opt.zero_grad()
    mon.close()
    return read_run(path).ranks[0]


def _scaler(init_scale):
    try:
        return torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1000)
    except (AttributeError, TypeError, RuntimeError) as exc:   # an older torch
        pytest.skip(f"no CPU GradScaler here: {exc}")


def test_loss_scale_is_recorded_and_gradients_are_unscaled(tmp_path):
    plain = _train(tmp_path / "plain")
    scaled = _train(tmp_path / "scaled", _scaler(2.0 ** 16))
    assert scaled.series("loss_scale").tolist() == [2.0 ** 16] * 6
    assert not plain.has("loss_scale")
    for col in ("0:bwd_norm", "2:bwd_norm", "4:bwd_norm", "grad_norm", "0.weight:grad_norm"):
        assert np.allclose(scaled.series(col), plain.series(col), rtol=1e-5), col


def test_steps_the_scaler_skips_are_not_inf_nan_alerts(tmp_path):
    stream = _train(tmp_path, _scaler(2.0 ** 127), steps=16, loss_factor=1e3)
    scale = stream.series("loss_scale")
    assert scale[0] == 2.0 ** 127 and scale[-1] < scale[0]      # it overflowed and backed off
    result = trend(tmp_path)
    kinds = {a.kind for a in result.alerts}
    assert kinds == {"scaler_skip"} and not result.found
    assert "GradScaler skips such a step" in result.alerts[0].reason
    assert result.alerts[0].phase == "backward"
