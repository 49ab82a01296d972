"""Reference statistics for the capture tests (tests/capture, tests/cuda): computed by the test
itself from the real tensor, in float64 on the CPU."""
from __future__ import annotations

import torch


def expected_stats(t: torch.Tensor) -> dict:
    """Reference statistics computed by the test itself, in float64.

    max/min are the range of the values that are not NaN (NaN when all are), as opdiff reports
    them; mean and norm follow IEEE (NaN in, NaN out; inf in, inf out).
    """
    x = t.detach().cpu().to(torch.float64)
    finite = x[~torch.isnan(x)]
    rng = finite if finite.numel() else x
    return {"max": rng.max().item(), "min": rng.min().item(), "mean": x.mean().item(),
            "norm": torch.linalg.vector_norm(x).item(),
            "nan": int(torch.isnan(x).sum()) if t.is_floating_point() else 0,
            "inf": int(torch.isinf(x).sum()) if t.is_floating_point() else 0}
