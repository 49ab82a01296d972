"""Shared fixtures: tiny real models of the families opdiff users debug, and dump helpers.

Every model is small enough that a forward + backward takes a few milliseconds on CPU, and
each one carries the construct that makes its family hard to capture:

    cnn           ResNet-style block with `out += identity` and ReLU(inplace=True), BatchNorm
    res3d         3D-conv residual net (the 3D_ResNet of seed 000), `out += residual`
    lstm          nn.LSTM (VF.lstm, multi-output) followed by a Linear head
    transformer   nn.MultiheadAttention + LayerNorm + GELU + Dropout (a random op in training)
    multi_output  forward returns a tuple, a dict, a namedtuple and non-tensor values
    inplace_relu  F.relu(x, inplace=True) and nn.ReLU(inplace=True) right after modules

Usage in a test:

    def test_something(tiny_model):            # parametrized over every family
        model, inputs, loss_fn = tiny_model.build()
        loss_fn(model(*inputs)).backward()

    def test_cnn(model_cases):
        model, inputs, loss_fn = model_cases["cnn"].build()
"""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    """torchvision's BasicBlock, shrunk: the in-place `out += identity` is the point."""

    def __init__(self, channels: int, conv=nn.Conv2d, norm=nn.BatchNorm2d):
        super().__init__()
        self.conv1 = conv(channels, channels, 3, padding=1, bias=False)
        self.bn1 = norm(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv(channels, channels, 3, padding=1, bias=False)
        self.bn2 = norm(channels)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        out = self.relu(out)
        return out


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(4))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class TinyResNet3D(nn.Module):
    """3D_ResNet in miniature: Conv3d stem, one residual block, global pool, classifier."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.conv1 = nn.Conv3d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm3d(4)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(4, conv=nn.Conv3d, norm=nn.BatchNorm3d))
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(self.pool(x).flatten(1))


class TinyLSTM(nn.Module):
    def __init__(self, features: int = 6, hidden: int = 8, classes: int = 3):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=1, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        seq, (h, c) = self.lstm(x)
        return self.head(seq[:, -1]) + 0.0 * c.sum()


class TinyTransformerBlock(nn.Module):
    """Pre-norm encoder block: attention and MLP residuals, dropout active in training."""

    def __init__(self, dim: int = 8, heads: int = 2, dropout: float = 0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + self.drop(a)
        x = x + self.drop(self.fc2(self.act(self.fc1(self.norm2(x)))))
        return x


Pair = collections.namedtuple("Pair", ["first", "second"])


class MultiOutput(nn.Module):
    """Outputs of every container shape, plus values that are not tensors."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)
        self.pair = PairHead()
        self.dicthead = DictHead()

    def forward(self, x):
        h = self.a(x)
        p = self.pair(h)
        d = self.dicthead(h)
        return (p.first, p.second, d["logits"], d["count"], d["tag"], None)


class PairHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return Pair(y.tanh(), y.sigmoid())


class DictHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return {"logits": self.lin(x), "count": x.shape[0], "tag": "dict", "scale": 0.5}


class InplaceReLUNet(nn.Module):
    """In-place ReLU right after a module, in both spellings."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(6, 6)
        self.fc3 = nn.Linear(6, 2)

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = F.relu(self.fc2(x), inplace=True)
        return self.fc3(x)


def _mean_sq(out):
    return out.float().pow(2).mean()


def _multi_loss(out):
    first, second, logits, _count, _tag, _none = out
    return first.sum() + second.pow(2).sum() + logits.mean()


@dataclass(frozen=True)
class ModelCase:
    """A model family: `build()` returns (model, inputs tuple, loss_fn), identical on every call."""

    name: str
    make_model: Callable[[], nn.Module]
    make_inputs: Callable[[torch.Generator], tuple]
    loss_fn: Callable = _mean_sq
    seed: int = 0

    def build(self):
        # A private generator for inputs and a fork of the global RNG for the weights, so
        # building a model never changes the random state a test is measuring.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = self.make_model()
        gen = torch.Generator().manual_seed(self.seed + 1)
        return model, self.make_inputs(gen), self.loss_fn


MODEL_CASES = {
    "cnn": ModelCase("cnn", TinyResNet, lambda g: (torch.randn(2, 3, 6, 6, generator=g),)),
    "res3d": ModelCase("res3d", TinyResNet3D, lambda g: (torch.randn(2, 3, 3, 4, 4, generator=g),)),
    "lstm": ModelCase("lstm", TinyLSTM, lambda g: (torch.randn(2, 5, 6, generator=g),)),
    "transformer": ModelCase("transformer", TinyTransformerBlock,
                             lambda g: (torch.randn(2, 4, 8, generator=g),)),
    "multi_output": ModelCase("multi_output", MultiOutput, lambda g: (torch.randn(3, 4, generator=g),),
                              loss_fn=_multi_loss),
    "inplace_relu": ModelCase("inplace_relu", InplaceReLUNet, lambda g: (torch.randn(3, 4, generator=g),)),
}

# The four families the observer-effect guarantee is stated for.
TRAINING_FAMILIES = ("cnn", "res3d", "lstm", "transformer")


@pytest.fixture
def model_cases() -> dict:
    """{name: ModelCase} for every tiny model family."""
    return MODEL_CASES


@pytest.fixture(params=sorted(MODEL_CASES))
def tiny_model(request) -> ModelCase:
    """Parametrized over every tiny model family."""
    return MODEL_CASES[request.param]


@pytest.fixture
def dump_root(tmp_path):
    """A dump_path that does not exist yet (opdiff creates it)."""
    return tmp_path / "dump"


# scripts/test.sh runs the suite in two parts. First everything but the tests that start Ray
# clusters or torchrun process groups, on several workers (pytest-xdist, `--dist loadgroup`): each
# top-level test directory is one group, run on one worker, so its session fixtures are built
# once. Then those process tests, alone in one process: a Ray raylet died under the shard-worker
# kill test while the other worker ran CPU-bound tests beside it. OPDIFF_TEST_PART ("parallel" or
# "alone") picks the part; unset, every test runs.
_PROCESS_GROUPS = {"distributed", "launch"}


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    part = os.environ.get("OPDIFF_TEST_PART")
    kept, left = [], []
    for item in items:
        parts = Path(item.path).relative_to(tests).parts
        group = parts[0] if len(parts) > 1 else "top"
        alone = group in _PROCESS_GROUPS or "_ray" in Path(item.path).stem
        item.add_marker(pytest.mark.xdist_group("processes" if alone else group))
        if part is None or (part == "alone") == alone:
            kept.append(item)
        else:
            left.append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


# CI sets OPDIFF_REQUIRE_BROWSER=1: there a browser test that skips because chromium is missing
# is a failure, so a broken install step cannot hide behind a skip.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("OPDIFF_REQUIRE_BROWSER") == "1":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "chromium" in reason.lower():
            report.outcome = "failed"
            report.longrepr = f"OPDIFF_REQUIRE_BROWSER=1 but the browser test was skipped: {reason}"


# A capture step freezes the objects older than it out of full garbage collections and gives
# them back when it closes. A test that leaves objects frozen (a step opened and never closed)
# would change what later tests see, so the freeze is undone here and the test is named: the
# warning summary of the run says which test leaked it.
@pytest.fixture(autouse=True)
def _gc_freeze_left_behind(request):
    import gc
    import warnings

    before = gc.get_freeze_count()
    yield
    frozen = gc.get_freeze_count()
    if before == 0 and frozen:
        gc.unfreeze()
        warnings.warn(f"{request.node.nodeid} left {frozen} objects frozen out of the garbage "
                      "collector (a capture step not closed?)", stacklevel=1)


_SEEDED_ENV = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "NCCL_DETERMINISTIC",
               "HCCL_DETERMINISTIC", "FLASH_ATTENTION_DETERMINISTIC")
_PROCESS_AS_STARTED: dict = {}


def _torch_flags():
    import torch

    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)


def pytest_sessionstart(session):
    import os

    _PROCESS_AS_STARTED["flags"] = _torch_flags()
    _PROCESS_AS_STARTED["env"] = {k: os.environ.get(k) for k in _SEEDED_ENV}


@pytest.fixture(autouse=True)
def _deterministic_mode_left_behind():
    """`opdiff.seed_all` (a user's call, made by many tests and module fixtures) turns torch's
    deterministic algorithms on for the process, and Inductor then compiles other kernels: a
    test run after one that seeded, in the same worker, dumped another program (the pinned
    counts of test_verdicts_unchanged's Inductor pair moved with the test order). After each
    test the process is put back as the session found it (not as the test found it: a module
    fixture seeds before any function fixture runs: `pytest_sessionstart` takes the state)."""
    import os

    yield
    import torch

    det, warn_only, *cudnn = _PROCESS_AS_STARTED["flags"]
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
     torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) = cudnn
    for k, v in _PROCESS_AS_STARTED["env"].items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
