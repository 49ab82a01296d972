"""Does one compiled run agree with the eager golden? opdiff's verdict, not allclose.

    golden = named_tensors(step())                   # {"output[0]": loss, "output[1]": ...}
    verdict = judge(named_tensors(compiled()), golden)
    verdict.agrees, verdict.reason                    # False, "output[2]: relative error ..."

Each tensor is measured (`opdiff.comparison.metrics.measure`) and judged by its dtype
(`opdiff.comparison.verdicts.Policy.judge`): a run agrees when no tensor is beyond what its
dtype allows (a warning, close to the tolerance, still agrees; reassociation and fusion change
rounding, which is not a compiler bug).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..comparison.metrics import measure
from ..comparison.result import ERROR
from ..comparison.verdicts import Policy


def named_tensors(value: Any, prefix: str = "output") -> dict[str, torch.Tensor]:
    """The tensors of a step's result (a tensor, or lists, tuples and dicts of them, nested),
    named by where they sit: `output`, `output[1]`, `output['loss']`. Others are left out."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(value, torch.Tensor):
        out[prefix] = value.detach().to("cpu").clone()
    elif isinstance(value, Mapping):
        for key, item in value.items():
            out.update(named_tensors(item, f"{prefix}[{key!r}]"))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            out.update(named_tensors(item, f"{prefix}[{i}]"))
    return out


@dataclass(frozen=True)
class RunVerdict:
    """One run against the golden: `agrees`, and in words the tensor that decides it."""
    agrees: bool
    reason: str
    error: float = 0.0           # the worst relative error (inf: shapes or inf/NaN differ)


def judge(target: Mapping[str, torch.Tensor], golden: Mapping[str, torch.Tensor],
          policy: Policy | None = None) -> RunVerdict:
    """Judge every golden tensor against the target's of the same name (see the module)."""
    policy = policy or Policy()
    worst: RunVerdict | None = None
    for name, g in golden.items():
        t = target.get(name)
        if t is None:
            return RunVerdict(False, f"{name}: missing from the compiled run", float("inf"))
        if tuple(t.shape) != tuple(g.shape):
            return RunVerdict(False, f"{name}: shape {tuple(t.shape)} against {tuple(g.shape)}",
                              float("inf"))
        dt = str(g.dtype).replace("torch.", "")
        m = measure(t, g)
        v = policy.judge(m, str(t.dtype).replace("torch.", ""), dt)
        error = float("inf") if m.nonfinite_mismatch else m.error
        if v.result == ERROR:
            return RunVerdict(False, f"{name}: {v.reason}", error)
        if worst is None or error > worst.error:
            worst = RunVerdict(True, f"{name}: relative error {error:.3g}" if error else
                               f"{name}: identical", error)
    if worst is None:
        return RunVerdict(True, "no tensors to compare")
    return worst


__all__ = ["named_tensors", "judge", "RunVerdict"]
