"""Environment fingerprint (written into every dump's meta.json) and the diff of two of them."""
from __future__ import annotations

import os
import platform
import sys


def fingerprint() -> dict:
    """What can make two runs compute differently: versions, devices, determinism, threads."""
    import torch

    env: dict = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cpu_capability": _safe(lambda: torch.backends.cpu.get_cpu_capability()),
    }
    try:
        import numpy
        env["numpy"] = numpy.__version__
    except ImportError:
        pass
    env["cuda_available"] = torch.cuda.is_available()
    if torch.version.cuda:
        env["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["cudnn"] = _safe(lambda: torch.backends.cudnn.version())
        env["cudnn_deterministic"] = torch.backends.cudnn.deterministic
        env["cudnn_benchmark"] = torch.backends.cudnn.benchmark
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        env["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    npu = getattr(torch, "npu", None)
    if npu is not None and _safe(npu.is_available):
        env["npu_devices"] = _safe(lambda: [npu.get_device_name(i) for i in range(npu.device_count())])
        env["torch_npu"] = _safe(lambda: __import__("torch_npu").__version__)
    if getattr(torch.backends, "mps", None) is not None and _safe(torch.backends.mps.is_available):
        env["mps"] = True
    for var in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "OMP_NUM_THREADS",
                "NCCL_DETERMINISTIC", "HCCL_DETERMINISTIC", "ASCEND_LAUNCH_BLOCKING"):
        if var in os.environ:
            env[f"env.{var}"] = os.environ[var]
    env["argv"] = " ".join(sys.argv)[:300]
    return env


def _safe(fn):
    try:
        return fn()
    except Exception:
        return None


# Keys that differ between any two runs and say nothing about numerics (the dump paths are
# on the command line, so argv always differs).
_NOISE = {"argv"}
_MISSING = "(absent)"


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def diff(target: dict | None, golden: dict | None) -> list[dict]:
    """[{"key", "target", "golden"}] for every fingerprint entry that differs, keys dotted
    (`devices.0`), sorted by key; noise (argv) left out; "(absent)" where one side lacks it."""
    t, g = _flatten(target or {}), _flatten(golden or {})
    out = []
    for key in sorted(set(t) | set(g)):
        if key.split(".", 1)[0] in _NOISE:
            continue
        a, b = t.get(key, _MISSING), g.get(key, _MISSING)
        if a != b:
            out.append({"key": key, "target": a, "golden": b})
    return out


def diff_meta(target_meta: dict | None, golden_meta: dict | None) -> list[dict]:
    """`diff` of the fingerprints two dumps' meta.json hold ([] when neither has one)."""
    return diff((target_meta or {}).get("environment"), (golden_meta or {}).get("environment"))
