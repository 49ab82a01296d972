"""Make the legacy fixtures under tests/data/msprobe/legacy/ (run once; the output is committed).

    python tests/data/make_fixtures/make_legacy_fixtures.py

Neither ptdbg_ascend nor torch_npu.hooks can be installed here (no PyPI release; torch_npu needs
an Ascend stack), so this script *re-creates their file formats* on CPU, written from what their
public sources and docs say they write (see tests/data/README.md for what is verified and what
is not). It runs a tiny residual CNN and writes:

- legacy/ptdbg_v4/ptdbg_dump_v4.0/step0/rank0/api_stack_dump.pkl (+ api_stack_dump/*.npy):
  ptdbg_ascend 4.x "api_stack" mode: per API call, one JSON line per tensor/scalar argument
  `[name, step, [], dtype, shape, [max, min, mean, norm]]`, then
  `[name_stack_info, [[file, line, function, code], ...]]`; backward lines as the autograd node
  runs, `backward_input` = gradients w.r.t. the forward outputs. One bf16 op (saved as fp32 .npy,
  as ptdbg did).
- legacy/npu_hooks/cpu_module_op.pkl: torch_npu.hooks `register_acc_cmp_hook` on leaf modules:
  `[name, flat values as float, dtype, shape]`, names `Module_{Class}_{forward|backward}_{input|output}.i`
  with no call counter; backward from a module backward hook (grad_input written as "input").
"""
from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = Path(__file__).resolve().parent.parent / "msprobe" / "legacy"


class PtdbgWriter:
    """Writes ptdbg_ascend-4.x-style lines for explicitly wrapped API calls."""

    def __init__(self, pkl: Path):
        self.pkl = pkl
        self.npy_dir = pkl.with_suffix("")
        self.npy_dir.mkdir(parents=True)
        self.lines: list = []
        self.counts: dict = {}

    def _tensor(self, name, t):
        t = t.detach()
        if t.is_floating_point():
            f = t.float()
            summary = [f.max().item(), f.min().item(), f.mean().item(), f.norm().item()]
        else:
            summary = [t.max().item(), t.min().item(), t.float().mean().item(), "Nan"]
        saved = t.float() if t.dtype == torch.bfloat16 else t
        np.save(self.npy_dir / f"{name}.npy", saved.contiguous().numpy())
        self.lines.append([name, 1, [], str(t.dtype), list(t.shape), summary])

    def _value(self, name, x, prefix):
        if isinstance(x, torch.Tensor):
            self._tensor(name, x)
        elif isinstance(x, (list, tuple)):
            for i, item in enumerate(x):
                self._value(f"{name}.{i}", item, prefix)
        elif isinstance(x, (bool, int, float)):
            self.lines.append([name, 1, [], str(type(x)), "[]", [x, x, x, x]])

    def call(self, prefix: str, api: str, fn, *args):
        n = self.counts.get((prefix, api), 0)
        self.counts[(prefix, api)] = n + 1
        head = f"{prefix}_{api}_{n}"
        for i, a in enumerate(args):       # before the call: in-place ops would overwrite them
            self._value(f"{head}_forward_input.{i}", a, head)
        out = fn(*args)
        self._value(f"{head}_forward_output", out, head)
        frames = [[fi.filename, str(fi.lineno), fi.function, (fi.code_context or [""])[0].strip()]
                  for fi in inspect.stack()[1:]]
        self.lines.append([f"{head}_forward_stack_info", frames])
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            def on_backward(grad_inputs, grad_outputs, head=head):
                self._value(f"{head}_backward_input", list(grad_outputs), head)
                self._value(f"{head}_backward_output", list(grad_inputs), head)
            out.grad_fn.register_hook(on_backward)
        return out

    def close(self):
        self.pkl.write_text("".join(json.dumps(item) + "\n" for item in self.lines))


def make_ptdbg():
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
    x = torch.randn(1, 2, 3, 3)
    w = PtdbgWriter(OUT / "ptdbg_v4/ptdbg_dump_v4.0/step0/rank0/api_stack_dump.pkl")
    residual = x
    out = w.call("Functional", "conv2d", F.conv2d, x, conv1.weight, conv1.bias, 1, 1)
    out = w.call("Functional", "relu", F.relu, out)
    out = w.call("Functional", "conv2d", F.conv2d, out, conv2.weight, conv2.bias, 1, 1)
    out = out.clone()  # not an API ptdbg wraps here; keeps the in-place add off a view
    out = w.call("Tensor", "__iadd__", torch.Tensor.__iadd__, out, residual)
    half = w.call("Tensor", "to", torch.Tensor.to, out, torch.bfloat16)
    act = w.call("Functional", "relu", F.relu, half)
    loss = w.call("Tensor", "sum", torch.Tensor.sum, act.float())
    loss.backward()
    w.close()


def make_npu_hooks():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 2, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
    path = OUT / "npu_hooks" / "cpu_module_op.pkl"
    path.parent.mkdir(parents=True)
    lines = []

    def dump(x, prefix):
        if isinstance(x, (tuple, list)):
            for i, item in enumerate(x):
                dump(item, f"{prefix}.{i}")
        elif isinstance(x, torch.Tensor):
            flat = x.detach().contiguous().view(-1).float().numpy().tolist()
            lines.append([prefix, flat, str(x.dtype), list(x.shape)])

    def hook(name):
        def on_call(module, in_feat, out_feat):
            dump(in_feat, f"{name}_input")
            dump(out_feat, f"{name}_output")
        return on_call

    for m in model.modules():
        if len(list(m.children())) == 0:
            prefix = f"Module_{type(m).__name__}_"
            m.register_forward_hook(hook(prefix + "forward"))
            m.register_full_backward_hook(hook(prefix + "backward"))
    x = torch.randn(1, 2, 2, 2, requires_grad=True)
    model(x).sum().backward()
    path.write_text("".join(json.dumps(item) + "\n" for item in lines))


if __name__ == "__main__":
    if OUT.exists():
        shutil.rmtree(OUT)
    make_ptdbg()
    make_npu_hooks()
    print("written under", OUT)
