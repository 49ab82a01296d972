"""A dump is untrusted input, regions included: replaying a region as a chain
(`opdiff.comparison.replay.chain`) checks every op of it against replay's allow-list before any
runs. A target whose region holds a `torch.load` of a pickle is compared with `--replay all`
through the real CLI: nothing is unpickled, the region is "not replayed as a chain" with the
reason, and the compare finishes."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opdiff

from pickle_payload import CLI, SRC
from pickle_payload import Payload as _Payload


def _dump(path: Path, fused: bool) -> Path:
    """A linear, then `silu(exp(y))` written two ways: a region (target: `Torch.exp`,
    `Functional.silu`; golden: `Tensor.exp`, `Torch.sigmoid`, `Tensor.__mul__`)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with opdiff.dump(model, path, level="mix", task="tensor"):
        y = model(torch.randn(2, 4))
        if fused:
            out = torch.nn.functional.silu(torch.exp(y))
        else:
            z = y.exp()
            out = torch.sigmoid(z) * z
        out.sum()
    return path / "step0" / "rank0"


@pytest.mark.slow
def test_a_region_holding_torch_load_is_not_replayed_and_runs_nothing(tmp_path):
    marker = tmp_path / "PWNED"
    payload = tmp_path / "payload.pt"
    with open(payload, "wb") as f:
        pickle.dump(_Payload(str(marker)), f)
    target, golden = _dump(tmp_path / "t", True), _dump(tmp_path / "g", False)
    recs = [json.loads(line) for line in (target / "records.jsonl").read_text().splitlines()]
    silu = next(r for r in recs if r["op"] == "Functional.silu")
    silu["op"] = "Torch.load"            # the region's second op; its first is a real exp
    silu["inputs"] = [{"type": "str", "value": str(payload)}]
    silu["kwargs"] = {"weights_only": {"type": "bool", "value": False}}
    (target / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", CLI, "compare", str(target), str(golden), "-o",
                           str(out), "--replay", "all"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert not marker.exists(), "region replay unpickled a payload (torch.load ran)"
    summary = (out / "summary.json").read_text()
    assert "region(s) replayed as chains" in summary, summary[-2000:]
    assert "Region.0.forward: Functional.silu.0.forward: untrusted: Torch.load" in summary
