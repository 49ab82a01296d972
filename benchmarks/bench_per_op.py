"""Host time opdiff spends per recorded op, on a model whose kernels take next to nothing.

    python benchmarks/bench_per_op.py [--steps 31] [--level mix] [--device cuda] [--floor] [--contract]
                                      [--json out.json]

A deep MLP of tiny layers (width 16, batch 4): the plain step is almost all Python and
dispatch, so (captured step - plain step) / records per step is opdiff's own cost per record,
free of the memory traffic that makes ratios on real models noisy here. On a GPU, where kernels
run asynchronously, this host time is what capture adds to a step. Plain and captured steps
alternate (one thread); medians. `--device cuda`: model and input there, each timed step ends
with a synchronize; the spread is the quartiles of the per-round per-record costs.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import statistics
import sys
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np
import orjson
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

import opdiff
from opdiff.capture.stats import cpu_stats
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


class ContractRecorder(FloorRecorder):
    """FloorRecorder plus the least of what an opdiff record must hold that FloorRecorder leaves
    out, each part done the cheapest way found: the statistics of each tensor (a small one's
    values copied at call time and min/max/mean/norm reduced at the end of the step in one batch
    of segment reductions per dtype; a large one reduced at call time by opdiff's own
    reductions, `stats.cpu_stats`), its producer (the record
    and slot that made it), the user's call site (the first frame outside torch, cached per code
    position), and one JSON line per record written at the end of the step. No names, selection,
    leaves, checks or module paths: the floor under any recorder that keeps opdiff's dump
    contract (`--contract`)."""

    def __init__(self, path: Path):
        super().__init__()
        self._path = path
        self._values: list = []
        self._staged = {dtype: _Staging(np_dtype) for dtype, np_dtype in _NUMPY.items()}
        self._made: dict = {}
        self._known: dict = {}
        self._sites: dict = {}

    def _site(self) -> int:
        f: object = sys._getframe(1)
        while f is not None:
            key = (f.f_code, f.f_lasti)
            site = self._sites.get(key)
            if site is None:
                inside = f.f_code.co_filename.startswith(_TORCH_DIR) or f.f_code in _RECORDER_CODE
                site = self._sites[key] = -1 if inside else len(self._sites)
            if site >= 0:
                return site
            f = f.f_back
        return -1

    def _heads(self, values) -> list:
        heads = []
        made = self._made
        for v in values if isinstance(values, (tuple, list)) else (values,):
            if isinstance(v, torch.Tensor):
                if type(v) is nn.Parameter and id(v) not in self._leaves:
                    self._leaves.add(id(v))
                    self.records.append(("leaf", id(v), v.shape, v.dtype))
                heads.append((id(v), v.shape, v.dtype, v._version, made.get(id(v)), self._copy(v)))
        return heads

    def _copy(self, v: torch.Tensor) -> int:
        """Copy v's values now, byte for byte into a kept buffer (as opdiff stages small CPU
        tensors); their index in self._values. A tensor read again unchanged (the next op's
        input, its module's output) is the same index: reduced once, as opdiff does."""
        known = self._known.get(id(v))
        if known is not None and known[0]() is v and known[1] == v._version:
            return known[2]
        index = self._stage(v)
        try:
            self._known[id(v)] = (weakref.ref(v), v._version, index)
        except TypeError:
            pass
        return index

    def _stage(self, v: torch.Tensor) -> int:
        n = v.numel() * v.element_size()
        if not v.is_contiguous() or v.device.type != "cpu" or v.dtype not in _NUMPY:
            self._values.append(None)
        elif v.numel() > _SMALL:     # reduced now, by opdiff's own reductions (the fastest found)
            self._values.append(("now", cpu_stats(v)))
        else:
            staging = self._staged[v.dtype]
            if staging.used + n > len(staging.buffer):
                staging.grow(staging.used + n)
                self._values = [None] * len(self._values)   # (a bench: never hit after warm-up)
            _memmove(staging.address + staging.used, v.data_ptr(), n)
            self._values.append((v.dtype, staging.used // v.element_size(), v.numel()))
            staging.used += n
        return len(self._values) - 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self._busy or getattr(func, "__name__", None) == "__get__":
            return func(*args, **(kwargs or {}))
        out = super().__torch_function__(func, types, args, kwargs)
        self._busy = True
        record = self.records[-1]
        record.append(self._site())
        seq = len(self.records) - 1
        for slot, v in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(v, torch.Tensor):
                self._made[id(v)] = (seq, slot)
        self._busy = False
        return out

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        with _no_torch_function():
            stats = _segment_stats(self._staged, self._values)
            with open(self._path, "w") as out:
                for record in self.records:
                    out.write(orjson.dumps([_jsonable(item, stats) for item in record]).decode() + "\n")
        self._values.clear()
        self._known.clear()
        for staging in self._staged.values():
            staging.used = 0
        self._made.clear()
        return result


_TORCH_DIR = str(Path(torch.__file__).parent)
_memmove = ctypes.memmove
_RECORDER_CODE = {f.__code__ for c in (FloorRecorder, ContractRecorder) for f in vars(c).values()
                  if hasattr(f, "__code__")}


_SMALL = 16384    # elements: a larger tensor is reduced at call time (opdiff's threshold)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


class _Staging:
    """A kept byte buffer the small tensors of one dtype are copied into, end to end."""

    def __init__(self, np_dtype):
        self.np_dtype = np_dtype
        self.used = 0
        self.grow(1 << 20)

    def grow(self, size: int) -> None:
        self.buffer = np.empty(size * 2, dtype=np.uint8)
        self.address = self.buffer.ctypes.data
        self.used = 0


def _segment_stats(staged: dict, values: list) -> list:
    """(min, max, mean, norm) of each copied tensor, reduced per dtype in one batch of segment
    reductions (numpy's reduceat over the tensors laid end to end; min and max in their dtype,
    sums in float64)."""
    out: list = [None] * len(values)
    by_dtype: dict = {}
    for i, v in enumerate(values):
        if v is not None and v[0] == "now":
            out[i] = v[1]
        elif v is not None and v[2]:
            by_dtype.setdefault(v[0], []).append(i)
    for dtype, indices in by_dtype.items():
        staging = staged[dtype]
        native = staging.buffer[:staging.used].view(staging.np_dtype)
        starts = np.fromiter((values[i][1] for i in indices), dtype=np.intp, count=len(indices))
        lengths = np.fromiter((values[i][2] for i in indices), dtype=np.float64, count=len(indices))
        wide = native.astype(np.float64)
        low = np.minimum.reduceat(native, starts).tolist()
        high = np.maximum.reduceat(native, starts).tolist()
        mean = (np.add.reduceat(wide, starts) / lengths).tolist()
        np.multiply(wide, wide, out=wide)
        norm = np.sqrt(np.add.reduceat(wide, starts)).tolist()
        for k, i in enumerate(indices):
            out[i] = (low[k], high[k], mean[k], norm[k])
    return out


def _jsonable(item, stats):
    if isinstance(item, list):
        return [(h[0], list(h[1]), str(h[2]), h[3], h[4], stats[h[5]]) if isinstance(h, tuple) else h
                for h in item]
    if isinstance(item, tuple):
        return [_jsonable(i, stats) for i in item]
    if isinstance(item, (int, float, str)) or item is None:
        return item
    if isinstance(item, torch.dtype):
        return str(item)
    return getattr(item, "__name__", None) or type(item).__name__


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
    parser.add_argument("--contract", action="store_true",
                        help="also time ContractRecorder (the floor plus statistics, producers, call "
                             "sites and JSON lines: the least a recorder keeping opdiff's dump "
                             "contract does) in the same rounds")
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
    contract, contract_records = [], 0
    recorder = FloorRecorder().watching(model)
    contractor = ContractRecorder(root / "contract.jsonl").watching(model)
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
            if args.contract:
                t0 = clock()
                with contractor:
                    step()
                contract.append(clock() - t0)
                contract_records = len(contractor.records)
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
    if args.contract:
        k = statistics.median(contract)
        figures["contract_us_per_record"] = (k - p) / contract_records * 1e6 if contract_records else None
        print(f"  contract recorder: {k * 1e3:.2f} ms, {contract_records} records: "
              f"{(k - p) / contract_records * 1e6:.1f} us per record, "
              f"{(k - p) / records * 1e6:.1f} us per opdiff record")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
