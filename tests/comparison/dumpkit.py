"""Build real dumps by hand for compare tests: real tensors, real DumpWriter files.

`Recorder` runs real torch functions and writes one record per call, the way capture does
(inputs described before the call, per-name counters, stacks pointing at this file).
"""
from __future__ import annotations

import inspect
from pathlib import Path

import torch

from opdiff.store import DumpWriter


def describe(t: torch.Tensor, key: str | None) -> dict:
    f = t.detach().float()
    d = {"type": "tensor", "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
         "device": "cpu", "requires_grad": False,
         "stats": {"max": float(f.max()), "min": float(f.min()), "mean": float(f.mean()),
                   "norm": float(f.norm()), "nan": int(torch.isnan(f).sum()),
                   "inf": int(torch.isinf(f).sum())}}
    for k in ("max", "min", "mean", "norm"):
        v = d["stats"][k]
        if v != v:
            d["stats"][k] = "NaN"
        elif v in (float("inf"), float("-inf")):
            d["stats"][k] = "Infinity" if v > 0 else "-Infinity"
    if key:
        d["key"] = key
    return d


class Recorder:
    """Write one step/rank of a dump: `rec.call("Functional.relu", torch.relu, x)`."""

    def __init__(self, path, *, save_tensors: bool = True, environment: dict | None = None):
        self.path = Path(path)
        self.writer = DumpWriter(self.path, {"config": {"task": "tensor"},
                                             "environment": environment or {}})
        self.save = save_tensors
        self.counters: dict[str, int] = {}
        self.seq = 0
        self.faults: dict[tuple, float] = {}

    def fault(self, op: str, call: int, scale: float, phase: str = "forward") -> "Recorder":
        """Scale the outputs of the `call`-th call of `op` by `scale` (a planted bug)."""
        self.faults[(op, call, phase)] = scale
        return self

    def _stack(self):
        from opdiff.capture.stacks import with_source   # code line and context, as capture

        frame = inspect.stack()[2]
        return self.writer.stack_id(with_source(((frame.filename, frame.lineno, frame.function),)))

    def call(self, op: str, fn, *args, kind: str = "api", phase: str = "forward",
             module: str | None = None, params: dict | None = None, forward: str | None = None,
             stack=None):
        n = self.counters.get((op, phase), 0)
        self.counters[(op, phase)] = n + 1
        name = f"{op}.{n}.{phase}" if kind != "module" else f"{op}.{phase}.{n}"
        inputs = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                key = f"{name}.input.{i}" if self.save else None
                inputs.append(describe(a, key))
                if self.save:
                    self.writer.save_tensor(key, a.detach().clone())
            else:
                inputs.append({"type": type(a).__name__, "value": a})
        out = fn(*args)
        scale = self.faults.get((op, n, phase))
        if scale is not None:
            out = (out.float() * scale).to(out.dtype)
        outs = out if isinstance(out, tuple) else (out,)
        outputs = []
        for i, o in enumerate(outs):
            key = f"{name}.output.{i}" if self.save else None
            outputs.append(describe(o, key))
            if self.save:
                self.writer.save_tensor(key, o.detach().clone())
        record = {"seq": self.seq, "name": name, "op": op, "kind": kind, "phase": phase,
                  "module": module, "inputs": inputs, "outputs": outputs,
                  "stack": stack if stack is not None else self._stack()}
        if params:
            record["parameters"] = {}
            for k, p in params.items():
                key = f"{name}.parameters.{k}" if self.save else None
                record["parameters"][k] = describe(p, key)
                if self.save:
                    self.writer.save_tensor(key, p.detach().clone())
        if forward:
            record["forward"] = forward
        self.writer.write(record)
        self.seq += 1
        return out

    def close(self):
        self.writer.close()


def cnn_run(path, *, bf16: bool = False, faults=(), extra_relu: bool = False, seed: int = 0,
            save_tensors: bool = True, environment: dict | None = None, batch: int = 4):
    """A small residual CNN, forward only, as a chain of real ops. bf16=True imitates autocast:
    conv and linear compute in bf16, everything else in fp32."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 16, 16, generator=g)
    w1 = torch.randn(8, 3, 3, 3, generator=g) * 0.3
    w2 = torch.randn(8, 8, 3, 3, generator=g) * 0.15
    w3 = torch.randn(8, 8, 3, 3, generator=g) * 0.15
    fc = torch.randn(10, 8 * 8 * 8, generator=g) * 0.03
    rec = Recorder(path, save_tensors=save_tensors, environment=environment)
    for f in faults:
        rec.fault(*f)
    lp = (lambda t: t.bfloat16()) if bf16 else (lambda t: t)
    conv = lambda a, w: torch.nn.functional.conv2d(lp(a), lp(w), padding=1)  # noqa: E731
    h = rec.call("Functional.conv2d", conv, x, w1)
    h = rec.call("Functional.relu", torch.relu, h.float())
    if extra_relu:
        h = rec.call("Functional.relu", torch.relu, h)
    r = h
    h = rec.call("Functional.conv2d", conv, h, w2)
    h = rec.call("Functional.relu", torch.relu, h.float())
    h = rec.call("Functional.conv2d", conv, h, w3)
    h = rec.call("Tensor.__iadd__", lambda a, b: a.float().add_(b), h, r)  # out += residual
    h = rec.call("Functional.relu", torch.relu, h)
    h = rec.call("Functional.max_pool2d", lambda a: torch.nn.functional.max_pool2d(a, 2), h)
    h = rec.call("Tensor.flatten", lambda a: a.flatten(1), h)
    out = rec.call("Functional.linear", lambda a, w: torch.nn.functional.linear(lp(a), lp(w)),
                   h, fc)
    rec.close()
    return out
