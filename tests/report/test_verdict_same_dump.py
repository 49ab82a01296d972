"""Comparing a dump with itself says so (issue 46, item 9), not a plain "no divergence": by the
file system (another spelling of the same path too), never for two runs that merely agree."""
from __future__ import annotations

import pytest
import torch

import opdiff
from opdiff.report.console import AGREE, verdict_kind


def _run(path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 2))
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="tensor", level="L1")
    dbg.start(model)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    dbg.stop()
    dbg.step()
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("same")
    return _run(root / "a"), _run(root / "b")


def test_a_dump_compared_with_itself_says_it(dumps, tmp_path):
    a, _ = dumps
    for golden in (a, a / "." / "step0" / ".." , str(a) + "/"):
        result = opdiff.compare(a, golden, replay="off")
        assert result.first_divergence is None
        assert "compared with itself" in result.verdict, result.verdict
        assert verdict_kind(result) == AGREE
    result = opdiff.compare(a, a, output_path=tmp_path / "out", replay="off")
    assert "compared with itself" in (tmp_path / "out" / "report.html").read_text()


def test_two_runs_that_agree_do_not_say_it(dumps):
    a, b = dumps
    result = opdiff.compare(a, b, replay="off")
    assert result.verdict.startswith("no divergence: every compared tensor agrees"), result.verdict
