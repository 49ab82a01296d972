"""Host time opdiff spends per recorded op, on a model whose kernels take next to nothing.

    python benchmarks/bench_per_op.py [--steps 31] [--level mix] [--device cuda] [--json out.json]

A deep MLP of tiny layers (width 16, batch 4): the plain step is almost all Python and
dispatch, so (captured step - plain step) / records per step is opdiff's own cost per record,
free of the memory traffic that makes ratios on real models noisy here. On a GPU, where kernels
run asynchronously, this host time is what capture adds to a step. Plain and captured steps
alternate (one thread); medians. `--device cuda`: model and input there, each timed step ends
with a synchronize; the spread is the quartiles of the per-round per-record costs.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

import opdiff
from opdiff.store import open_dump


def tiny_mlp(depth: int = 32, width: int = 16) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


_no_torch_function = torch._C.DisableTorchFunction


class FloorRecorder(TorchFunctionMode):
    """The least a mix capture can do in Python: the records opdiff writes for this step (API
    and module calls forward and backward, leaves at first read, parameter gradients), each a
    tuple of tensor heads (id, shape, dtype, version). No statistics, stacks, names, checks or
    files: what is left is the cost of being called, the floor under any Python capture."""

    def __init__(self):
        super().__init__()
        self.records: list = []
        self._busy = False
        self._leaves: set = set()
        self._calls: list = []
        self._handles: list = []

    def _heads(self, values) -> list:
        heads = []
        for v in values if isinstance(values, (tuple, list)) else (values,):
            if isinstance(v, torch.Tensor):
                if type(v) is nn.Parameter and id(v) not in self._leaves:
                    self._leaves.add(id(v))
                    self.records.append(("leaf", id(v), v.shape, v.dtype))
                heads.append((id(v), v.shape, v.dtype, v._version))
        return heads

    def _backward(self, name, out) -> None:
        """One record when autograd reaches the node that made `out`."""
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            out.grad_fn.register_hook(lambda gi, go: self.records.append((name, self._heads(gi),
                                                                          self._heads(go))))

    def _grad(self, p) -> None:
        with _no_torch_function():
            self.records.append(("grad", self._heads(p.grad)))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._busy or getattr(func, "__name__", None) == "__get__":
            return func(*args, **kwargs)
        self._busy = True
        record = [func, self._heads(args)]
        self._busy = False
        out = func(*args, **kwargs)
        self._busy = True
        record.append(self._heads(out))
        self.records.append(record)
        self._backward(func, out)
        self._busy = False
        return out

    # (module hooks run with the mode on: their own attribute reads must not pass through it)
    def _pre(self, module, args):
        with _no_torch_function():
            self._calls.append([module, self._heads(args)])

    def _post(self, module, args, out):
        with _no_torch_function():
            record = self._calls.pop()      # one record per module call, as opdiff writes
            record.append(self._heads(out))
            self.records.append(record)
            self._backward(module, out)

    def watching(self, model: nn.Module) -> "FloorRecorder":
        self._model = model
        return self

    def __enter__(self):
        self.records.clear()
        self._leaves.clear()
        self._handles = [nn.modules.module.register_module_forward_pre_hook(self._pre),
                         nn.modules.module.register_module_forward_hook(self._post)]
        self._handles += [p.register_post_accumulate_grad_hook(self._grad) for p in self._model.parameters()]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return super().__exit__(*exc)


class BareMode(TorchFunctionMode):
    """A torch-function mode that only calls through: what intercepting each call costs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=31)
    parser.add_argument("--level", default="mix")
    parser.add_argument("--task", default="statistics")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this process's CPU time (steadier on a shared machine)")
    parser.add_argument("--pattern", choices=["reuse", "construct"], default="reuse",
                        help="reuse: one debugger, start/stop/step each step (what a user does); "
                             "construct: a new PrecisionDebugger every step (the old figure)")
    parser.add_argument("--floor", action="store_true",
                        help="also time a bare torch-function mode and FloorRecorder (the least a "
                             "Python capture can do per record) in the same rounds")
    parser.add_argument("--device", default="cpu", help="where the MLP runs (cuda: steps synchronized)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_mlp().to(args.device)
    x = torch.randn(4, 16).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        sync()

    for _ in range(3):
        step()
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-"))
    plain, captured, records = [], [], 0
    bare, floor, floor_records = [], [], 0
    recorder = FloorRecorder().watching(model)
    shared = opdiff.PrecisionDebugger(dump_path=str(root / "shared"), level=args.level,
                                      task=args.task)
    try:
        for i in range(args.steps):
            t0 = clock()
            step()
            plain.append(clock() - t0)
            if args.pattern == "reuse":
                path, dbg, t0 = root / "shared", shared, clock()
            else:
                path, t0 = root / str(i), clock()
                dbg = opdiff.PrecisionDebugger(dump_path=str(path), level=args.level, task=args.task)
            dbg.start(model)
            step()
            dbg.stop()
            dbg.step()
            captured.append(clock() - t0)
            if args.floor:
                t0 = clock()
                with BareMode():
                    step()
                bare.append(clock() - t0)
                t0 = clock()
                with recorder:
                    step()
                floor.append(clock() - t0)
                floor_records = len(recorder.records)
            directory = path / f"step{dbg.session.step_index - 1}" / "rank0"
            if i == 0:
                records = sum(1 for _ in open_dump(directory).records())
            shutil.rmtree(directory.parent if args.pattern == "reuse" else path, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p, c = statistics.median(plain), statistics.median(captured)
    per_round = sorted((ci - pi) / records * 1e6 for ci, pi in zip(captured, plain))
    q = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
    print(f"level {args.level}, task {args.task}, {args.clock} clock, device {args.device}: plain step "
          f"{p * 1e3:.2f} ms, captured {c * 1e3:.2f} ms, {records} records: "
          f"{(c - p) / records * 1e6:.1f} us per record (quartiles {q[0]:.1f}-{q[2]:.1f})")
    figures = {"device": args.device, "level": args.level, "task": args.task, "records": records,
               "plain_ms": p * 1e3, "step_ms": c * 1e3, "ratio": c / p,
               "us_per_record": (c - p) / records * 1e6, "q1": q[0], "q3": q[2]}
    if args.floor:
        b, f = statistics.median(bare), statistics.median(floor)
        figures["floor_us_per_record"] = (f - p) / floor_records * 1e6 if floor_records else None
        print(f"  bare torch-function mode: {b * 1e3:.2f} ms, {(b - p) / records * 1e6:.1f} us per opdiff record")
        print(f"  floor recorder: {f * 1e3:.2f} ms, {floor_records} records: "
              f"{(f - p) / floor_records * 1e6:.1f} us per record, "
              f"{(f - p) / records * 1e6:.1f} us per opdiff record")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
