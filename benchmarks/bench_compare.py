"""Compare throughput: build a tensor dump pair of a few hundred MB, time `opdiff.compare`.

    python benchmarks/bench_compare.py [--mb 300] [--dir /tmp/opdiff-bench] [--keep]

Prints MB/s per side (bytes of tensors read from each dump divided by compare wall time) and
the peak RSS of the process, which must stay near a few tensors' worth, not the dump's size.
The target differs from the golden by bf16-sized noise, so no metric takes a shortcut.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from opdiff.store import DumpWriter


def build(root: Path, total_mb: int, tensor_mb: float = 4.0) -> int:
    """Write golden and target dumps of ~total_mb of float32 tensors each; returns bytes per side."""
    numel = int(tensor_mb * (1 << 20) / 4)
    n_ops = max(1, int(total_mb / (2 * tensor_mb)))     # two tensors (input, output) per op
    g = torch.Generator().manual_seed(0)
    writers = {side: DumpWriter(root / side / "step0" / "rank0", {"environment": {}})
               for side in ("golden", "target")}
    nbytes = 0
    for i in range(n_ops):
        x = torch.randn(numel, generator=g)
        y = torch.tanh(x)
        for side, w in writers.items():
            noise = side == "target"
            xi = x if not noise else x.bfloat16().float()
            yi = y if not noise else torch.tanh(xi).bfloat16().float()
            name = f"Torch.tanh.{i}.forward"
            rec = {"seq": i, "name": name, "op": "Torch.tanh", "kind": "api", "phase": "forward",
                   "module": None, "stack": None,
                   "inputs": [_desc(xi, f"{name}.input.0")],
                   "outputs": [_desc(yi, f"{name}.output.0")]}
            w.write(rec)
            w.save_tensor(f"{name}.input.0", xi.clone())
            w.save_tensor(f"{name}.output.0", yi.clone())
        nbytes += 2 * numel * 4
    for w in writers.values():
        w.close()
    return nbytes


def _desc(t: torch.Tensor, key: str) -> dict:
    return {"type": "tensor", "dtype": "float32", "shape": list(t.shape), "key": key,
            "stats": {"max": float(t.max()), "min": float(t.min()), "mean": float(t.mean()),
                      "norm": float(t.norm()), "nan": 0, "inf": 0}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=300, help="MB of tensors per side (default 300)")
    ap.add_argument("--dir", default=None, help="where to build the dumps (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the dumps afterwards")
    args = ap.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="opdiff-bench-"))
    try:
        t0 = time.perf_counter()
        nbytes = build(root, args.mb)
        built = time.perf_counter() - t0
        # Compare in a child process so its peak RSS is its own, not the build's.
        code = ("import sys, time, json; from opdiff.compare.engine import compare; "
                "t = time.perf_counter(); r = compare(sys.argv[1], sys.argv[2], progress=False); "
                "print(json.dumps({'wall': time.perf_counter() - t, 'rows': len(r.rows), "
                "'first': r.first_divergence and r.first_divergence.name}))")
        proc = subprocess.run([sys.executable, "-c", code, str(root / "target"),
                               str(root / "golden")], capture_output=True, text=True, check=True)
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        mb = nbytes / 1e6
        print(f"{'tensors per side':<28}{mb:10.1f} MB  ({out['rows']} tensors)")
        print(f"{'build time':<28}{built:10.2f} s")
        print(f"{'compare time':<28}{out['wall']:10.2f} s")
        print(f"{'throughput per side':<28}{mb / out['wall']:10.1f} MB/s   (goal >= 200)")
        print(f"{'compare peak RSS':<28}{peak:10.1f} MB   (import torch alone: ~300 MB)")
        print(f"{'first divergence':<28}{out['first']}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
