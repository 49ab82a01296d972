"""A tensor dump recorded on CUDA compared against a CPU dump of the same model: a healthy run
names nothing, a planted fault is named; `opdiff check --device cuda` on CPU-recorded dumps."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch

import opdiff
import opdiff.testing
from opdiff.check import check_dump
from opdiff.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comparison" / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "check"))
import replay_models  # noqa: E402
from checkmodels import dump as cpu_dump  # noqa: E402

pytestmark = pytest.mark.cuda


@contextlib.contextmanager
def _no_tf32():
    """fp32 as fp32: TF32 convolutions and matmuls (PyTorch's cuDNN default) differ from the CPU
    by ~1e-3, a real difference opdiff would rightly report. opdiff.seed_all(deterministic=True)
    turns them off the same way."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _run(name, path, device, bf16=False, fault=None):
    """replay_models' model `name`, one forward+backward step on `device`, dumped (tensor, mix)."""
    model, x = replay_models.make(name)
    model, x = model.to(device), x.to(device)
    ctx = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with _no_tf32(), ctx, opdiff.dump(model, path, level="mix", task="tensor"):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        out.float().pow(2).mean().backward()
    return path


@pytest.fixture(scope="module")
def cpu_golden(tmp_path_factory):
    return _run("cnn", tmp_path_factory.mktemp("cpu") / "d", "cpu")


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_a_healthy_cuda_run_against_cpu_names_nothing(cpu_golden, tmp_path, bf16):
    target = _run("cnn", tmp_path / "t", "cuda", bf16=bf16)
    result = opdiff.compare(target, cpu_golden)
    assert result.first_divergence is None, result.verdict
    assert result.counts["error"] == 0


@pytest.mark.parametrize("op,call,phase", [("Functional.conv2d", 2, "forward"),
                                           ("Tensor.__iadd__", 0, "forward"),
                                           ("Functional.conv2d", 2, "backward")])
def test_a_fault_planted_on_cuda_is_named(cpu_golden, tmp_path, op, call, phase):
    fault = dict(op=op, call=call, phase=phase, scale=1 + 1e-4)
    target = _run("cnn", tmp_path / "t", "cuda", fault=fault)
    fd = opdiff.compare(target, cpu_golden).first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.{phase}", fd


def test_check_device_cuda_reruns_a_cpu_statistics_dump_on_the_gpu(tmp_path, capsys):
    """A CPU-recorded statistics dump checked with --device cuda: its ops re-run on the GPU
    (made-up inputs within the dumped ranges) against float64 on the CPU; healthy: nothing
    fails; a fault planted in the checking process: the first conv2d is named."""
    stats = cpu_dump("cnn", tmp_path / "s", task="statistics")
    out = tmp_path / "out"
    with _no_tf32():
        assert main(["check", str(stats), "-o", str(out), "--device", "cuda", "--no-progress"]) == 0, \
            capsys.readouterr()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["device"] == "cuda" and summary["failed"] == 0 and summary["checked"] > 10, summary
        with opdiff.testing.inject_fault(op="Functional.conv2d", call=None, phase="forward", scale=1.001):
            faulty = check_dump(stats, device="cuda")
    assert faulty.first_failure is not None and faulty.first_failure.name == "Functional.conv2d.0.forward"


def test_check_device_cuda_on_a_cpu_tensor_dump(tmp_path, capsys):
    """A CPU-recorded tensor dump holds the outputs to judge: --device cuda is accepted (CUDA is
    usable here), noted as not used, and the verdicts are those of the plain check: a planted
    fault is named either way."""
    path = cpu_dump("cnn", tmp_path / "d", fault=dict(op="Functional.conv2d", call=1,
                                                        phase="forward", scale=1.001))
    on_cuda = check_dump(path, device="cuda")
    plain = check_dump(path)
    assert any("--device cuda not used" in n for n in on_cuda.notes), on_cuda.notes
    assert on_cuda.first_failure is not None and on_cuda.first_failure.name == "Functional.conv2d.1.forward"
    assert [(o.name, o.status) for o in on_cuda.ops] == [(o.name, o.status) for o in plain.ops]
    assert main(["check", str(path), "-o", str(tmp_path / "out"), "--device", "cuda", "--no-progress",
                 "--fail-on-failure"]) == 1
