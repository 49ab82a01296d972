"""Real outputs of every command, made once per session for the schema tests: the demo scenarios
(compare, trend with its monitor streams and next_dump.json, fp16 overflow), `opdiff check` and
`opdiff overflow` on the demos' dumps, a multi-rank compare of the distributed tests' rank dumps,
and `opdiff onnx` on the ONNX tests' tiny model. Commands run as `python -m opdiff`, a separate
process each, as a user runs them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def opdiff(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "opdiff", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"opdiff {' '.join(map(str, args))}: rc {proc.returncode}\n{proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="session")
def demo_outputs(tmp_path_factory):
    """{scenario: its output directory} for the demos that write every kind of file."""
    root = tmp_path_factory.mktemp("demos")
    out = {}
    for scenario in ("iadd", "trend", "fp16-overflow"):
        out[scenario] = root / scenario
        opdiff("demo", "--scenario", scenario, "-o", out[scenario])
    return out


@pytest.fixture(scope="session")
def check_output(demo_outputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("check")
    opdiff("check", demo_outputs["iadd"] / "dump" / "target" / "step0" / "rank0", "-o", out)
    return out


@pytest.fixture(scope="session")
def overflow_output(demo_outputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("overflow")
    opdiff("overflow", demo_outputs["fp16-overflow"] / "dump" / "statistics", "-o", out)
    return out


@pytest.fixture(scope="session")
def ranks_output(tmp_path_factory):
    """A compare of two 2-step, 3-rank tensor dump roots, a fault on rank 2."""
    sys.path.insert(0, str(TESTS / "distributed"))
    try:
        from rank_dumps import dump_ranks
    finally:
        sys.path.remove(str(TESTS / "distributed"))
    d = tmp_path_factory.mktemp("ranks")
    dump_ranks(d / "target", task="tensor", ranks=3, steps=2, faulty={2}, own_inputs=True)
    dump_ranks(d / "golden", task="tensor", ranks=3, steps=2, own_inputs=True)
    opdiff("compare", d / "target", d / "golden", "-o", d / "out")
    return d / "out"


@pytest.fixture(scope="session")
def onnx_output(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    sys.path.insert(0, str(TESTS / "onnx"))
    try:
        import tiny_models
    finally:
        sys.path.remove(str(TESTS / "onnx"))
    d = tmp_path_factory.mktemp("onnx")
    model = tiny_models.export_ts(tiny_models.build_model(), d / "cnn.onnx")
    opdiff("onnx", model, model, "--golden-opt", "disable_all", "--target-opt", "all", "-o", d / "out")
    return d / "out"
