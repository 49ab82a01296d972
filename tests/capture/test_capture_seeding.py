"""opdiff.seed_all: two seeded runs draw the same numbers from Python, NumPy and torch."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdiff
from opdiff import ConfigError


@pytest.fixture(autouse=True)
def _restore_global_state(monkeypatch):
    """seed_all changes process-wide switches: put them back for the other tests."""
    det = torch.are_deterministic_algorithms_enabled()
    warn = torch.is_deterministic_algorithms_warn_only_enabled()
    for var in ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "NCCL_DETERMINISTIC",
                "HCCL_DETERMINISTIC", "FLASH_ATTENTION_DETERMINISTIC"):
        monkeypatch.setenv(var, os.environ[var]) if var in os.environ else monkeypatch.delenv(var, raising=False)
    with torch.random.fork_rng(devices=[]):
        state = random.getstate(), np.random.get_state()
        yield
        random.setstate(state[0])
        np.random.set_state(state[1])
    torch.use_deterministic_algorithms(det, warn_only=warn)


def _draws():
    lin = nn.Linear(3, 3)
    return (random.random(), random.randint(0, 10 ** 9), np.random.rand(3).tolist(),
            torch.randn(4).tolist(), torch.randint(0, 100, (5,)).tolist(),
            torch.rand(2, generator=None).tolist(), lin.weight.detach().flatten().tolist(),
            torch.nn.functional.dropout(torch.ones(8), 0.5, training=True).tolist())


def test_two_seeded_runs_draw_the_same_numbers():
    opdiff.seed_all(seed=1234, deterministic=True)
    first = _draws()
    _draws()  # advance everything
    opdiff.seed_all(seed=1234, deterministic=True)
    assert _draws() == first
    opdiff.seed_all(seed=4321, deterministic=True)
    assert _draws() != first


def test_deterministic_switches():
    opdiff.seed_all(7, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["PYTHONHASHSEED"] == "7"
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") in (":4096:8", ":16:8")
    torch.use_deterministic_algorithms(False)
    opdiff.seed_all(7, deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("seed", [-1, 1.5, "1234", True])
def test_bad_seed_is_a_config_error(seed):
    with pytest.raises(ConfigError, match="seed"):
        opdiff.seed_all(seed)


_CHILD = ("import json, random, numpy as np, torch, opdiff\n"
          "opdiff.seed_all(99)\n"
          "print(json.dumps([random.random(), np.random.rand(), torch.randn(2).tolist()]))\n")


@pytest.mark.slow
def test_two_processes_draw_the_same_numbers():
    # Separate interpreters: nothing shared but the seed.
    outs = [subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), outs[0].stderr[-2000:]
    first, second = (json.loads(o.stdout) for o in outs)
    assert first == second
    assert len(first) == 3 and len(first[2]) == 2
