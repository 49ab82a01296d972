"""Inductor's Triton kernels recorded through their launcher (capture/kernel_triton.py, with
OPDIFF_TRITON_KERNELS=1), on CUDA. Written without a GPU to run it on (no device was lent to
the session that wrote it): `benchmarks/gpu_check.sh` runs it where one is. What must hold: the
compiled step stays bitwise the same without a graph break, each Triton kernel call is a record
of kind kernel with its tensors' statistics, and at mix each names the modules it computes."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff
from opdiff.capture.inductor import TRITON_ENV

pytestmark = pytest.mark.cuda


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))) * 2)


def _step(path, level: str):
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    model = _Net().cuda()
    x = torch.randn(4, 8, device="cuda", requires_grad=True)
    run = torch.compile(model)
    torch._dynamo.reset()
    counters.clear()
    if path is None:
        out = run(x)
        out.square().mean().backward()
    else:
        with opdiff.dump(model, str(path), level=level):
            out = run(x)
            out.square().mean().backward()
    torch.cuda.synchronize()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return out.detach(), grads, sum(counters["graph_break"].values())


@pytest.mark.parametrize("level", ["L2", "mix"])
def test_triton_kernels_are_recorded_and_the_step_is_unchanged(tmp_path, monkeypatch, level):
    monkeypatch.setenv(TRITON_ENV, "1")
    plain = _step(None, level)
    recorded = _step(tmp_path, level)
    assert torch.equal(plain[0], recorded[0]) and torch.equal(plain[1], recorded[1])
    assert recorded[2] == plain[2] == 0
    records = [json.loads(line) for f in tmp_path.rglob("records.jsonl")
               for line in f.read_text().splitlines() if line]
    kernels = [r for r in records if r["kind"] == "kernel"]
    assert kernels and all(r["op"].startswith("Inductor.triton_") for r in kernels), \
        sorted({r["op"] for r in records})
    for r in kernels:
        assert r["compiled"]["backend"] == "inductor" and r["compiled"]["node"].startswith("triton_")
        tensors = [d for d in r["inputs"] + r["outputs"] if d.get("type") == "tensor"]
        assert tensors and all(d["device"].startswith("cuda") for d in tensors)
        assert all(d.get("stats") for d in r["outputs"]), r["name"]
    if level == "mix":
        assert all(r["compiled"].get("modules") for r in kernels if r["phase"] == "forward"), \
            [(r["name"], r["compiled"]) for r in kernels]
