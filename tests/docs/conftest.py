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


def start(*args) -> subprocess.Popen:
    """`python -m opdiff ARGS` started in its own process (this checkout's opdiff)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "opdiff", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{' '.join(proc.args[2:])}: rc {proc.returncode}\n{err[-2000:]}"


def opdiff(*args) -> None:
    finish(start(*args))


@pytest.fixture(scope="session")
def demo_outputs(tmp_path_factory):
    """{scenario: its output directory} for the demos that write every kind of file."""
    root = tmp_path_factory.mktemp("demos")
    out = {scenario: root / scenario for scenario in ("iadd", "trend", "fp16-overflow")}
    running = [start("demo", "--scenario", scenario, "-o", path) for scenario, path in out.items()]
    for proc in running:
        finish(proc)
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
    """A compare of two 2-step, 3-rank statistics dump roots, each rank its own batch, a fault
    on rank 2."""
    sys.path.insert(0, str(TESTS / "distributed"))
    try:
        from rank_dumps import dump_ranks
    finally:
        sys.path.remove(str(TESTS / "distributed"))
    d = tmp_path_factory.mktemp("ranks")
    dump_ranks(d / "target", task="statistics", ranks=3, steps=2, faulty={2}, own_inputs=True)
    dump_ranks(d / "golden", task="statistics", ranks=3, steps=2, own_inputs=True)
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
