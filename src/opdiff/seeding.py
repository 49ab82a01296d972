"""seed_all: make two runs draw the same random numbers and pick the same kernels."""
from __future__ import annotations

import logging
import os
import random

log = logging.getLogger("opdiff")


def seed_all(seed: int = 1234, deterministic: bool = True, warn_only: bool = True) -> None:
    """Seed Python, NumPy, torch and every device generator, and ask for deterministic kernels.

    With `deterministic=True`: `torch.use_deterministic_algorithms(True, warn_only=warn_only)`
    (warn-only by default, so an op without a deterministic kernel warns instead of failing),
    cuDNN deterministic and not benchmarking, TF32 off, and the environment variables cuBLAS,
    NCCL/HCCL and flash attention read (set before their libraries initialise, so call this early).

        opdiff.seed_all(1234)
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        from .errors import ConfigError
        raise ConfigError(f"seed must be a non-negative integer; got {seed!r}")
    os.environ["PYTHONHASHSEED"] = str(seed)  # takes effect for subprocesses (dataloader workers)
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % (2 ** 32))
    except ImportError:
        pass
    import torch

    torch.manual_seed(seed)  # seeds the CPU and every initialised device generator
    for name in ("cuda", "xpu", "mps", "npu"):
        backend = getattr(torch, name, None)
        if backend is not None and hasattr(backend, "manual_seed_all"):
            try:
                backend.manual_seed_all(seed)
            except Exception:  # a backend compiled in but without a device
                pass
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ.setdefault("NCCL_DETERMINISTIC", "1")
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")
        os.environ.setdefault("FLASH_ATTENTION_DETERMINISTIC", "1")
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        if hasattr(torch.backends, "cudnn"):
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.allow_tf32 = False
        if hasattr(torch.backends, "cuda"):
            torch.backends.cuda.matmul.allow_tf32 = False
    log.info("opdiff: seeded everything with %d (deterministic=%s)", seed, deterministic)
