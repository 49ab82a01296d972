"""A recorded step raises the youngest GC generation's threshold once, whatever steps before it
left open: a step opened again before it closed (or a sink dropped unclosed) used to leave its
raised threshold behind, the next step raised it again, and after ten the threshold passed what
`gc.set_threshold` takes: every later step in the process failed to open with OverflowError
(seen running tests/security and tests/store in one process)."""
from __future__ import annotations

import gc

import torch

import opdiff
from opdiff.capture import sink


def test_a_threshold_opdiff_raised_is_not_raised_again(tmp_path):
    before = gc.get_threshold()
    try:
        for _ in range(25):          # 700 * 32**25 is past a C int
            sink._fewer_young_collections()     # opened, never closed
        assert gc.get_threshold()[0] <= before[0] * sink._YOUNG_FACTOR
        model = torch.nn.Linear(4, 4)
        with opdiff.dump(model, tmp_path / "last", level="L1", task="statistics"):
            model(torch.randn(2, 4))
        assert (tmp_path / "last").exists()
    finally:
        gc.set_threshold(*before)


def test_a_closed_step_gives_the_thresholds_back(tmp_path):
    before = gc.get_threshold()
    model = torch.nn.Linear(4, 4)
    with opdiff.dump(model, tmp_path / "d", level="L1", task="statistics"):
        model(torch.randn(2, 4))
        assert gc.get_threshold()[0] == before[0] * sink._YOUNG_FACTOR
    assert gc.get_threshold() == before
