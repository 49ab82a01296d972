"""Alignment and region finding on two big synthetic statistics dumps' records.

    python benchmarks/bench_align.py [--records 200000]

Two op sequences of a transformer-like model (layers of linear / norm / attention / MLP ops,
forward then backward, with dataflow producers on inputs): "identical" compares the sequence
with itself (the fast path), "regions" against one whose attention runs one fused SDPA call
where the other runs eight eager ops, in every layer and both phases. Reports the time of
`align` + `find_regions` + `one_sided` + the boundary search (`Boundaries`), and the peak Python memory they
allocate beyond the records themselves (tracemalloc).
"""
from __future__ import annotations

import argparse
import time
import tracemalloc

from opdiff.comparison.align import align
from opdiff.comparison.region_boundaries import Boundaries
from opdiff.comparison.region_onesided import one_sided
from opdiff.comparison.regions import find_regions
from opdiff.store.schema import complete

EAGER = ["Torch.matmul", "Tensor.__mul__", "Tensor.__add__", "Functional.softmax", "Tensor.to",
         "Functional.dropout", "Torch.matmul", "Tensor.reshape"]
FUSED = ["Functional.scaled_dot_product_attention", "Tensor.reshape"]
AROUND = ["Functional.linear", "Tensor.view", "Tensor.transpose", "Functional.linear",
          "Tensor.view", "Tensor.transpose", "Functional.linear", "Tensor.view",
          "Tensor.transpose"]
AFTER = ["Tensor.transpose", "Tensor.contiguous", "Tensor.reshape", "Functional.linear",
         "Tensor.__add__", "Functional.rms_norm", "Functional.linear", "Functional.silu",
         "Functional.linear", "Tensor.__mul__", "Functional.linear", "Tensor.__add__"]


def tensor(shape: list[int], producer: int | None) -> dict:
    desc = {"type": "tensor", "dtype": "float32", "shape": shape,
            "stats": {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 3.0, "nan": 0, "inf": 0}}
    if producer is not None:
        desc["producer"] = [producer, 0]
    return desc


def records(n: int, attention: list[str]) -> list[dict]:
    """About n records: per layer and phase, the attention's ops inside its module call, then
    the rest of the layer inside the layer's call, each call's module record after its ops (as
    level mix records them)."""
    out: list[dict] = []
    counters: dict[str, int] = {}
    per_layer = len(AROUND) + len(attention) + len(AFTER) + 2
    layers = max(1, n // (2 * per_layer))

    def add(op: str, phase: str, module: str, kind: str = "api") -> None:
        key = f"{op}.{phase}"
        index = counters.get(key, 0)
        counters[key] = index + 1
        seq = len(out)
        prev = seq - 1 if seq and phase == "forward" else None
        shape = [2, 8, 128, 64] if op == "Functional.scaled_dot_product_attention" else [2, 128, 512]
        name = f"{op}.{phase}.{index}" if kind == "module" else f"{op}.{index}.{phase}"
        out.append(complete({"seq": seq, "name": name, "op": op, "kind": kind, "phase": phase,
                             "module": module, "inputs": [tensor(shape, prev)],
                             "outputs": [tensor(shape, None)]}))   # as a dump's reader gives it

    for phase in ("forward", "backward"):
        for layer in range(layers):
            block = f"Module.model.layers.{layer}.Block"
            attn = f"Module.model.layers.{layer}.self_attn.Attention"
            for op in AROUND + attention:
                add(op, phase, f"{attn}.{phase}.0")
            add(attn, phase, f"{block}.{phase}.0", "module")
            for op in AFTER:
                add(op, phase, f"{block}.{phase}.0")
            add(block, phase, "Module.model.Model.forward.0", "module")
    return out


def _run(target: list[dict], golden: list[dict]) -> tuple[int, int]:
    pairs = align(target, golden)
    regions = find_regions(pairs, target, golden)
    regions += one_sided(regions, pairs, target, golden, True)
    bounds = Boundaries(target, True, {}, {})
    consumers = bounds.consumers(regions)
    for region in regions:
        bounds.by_dataflow(region, consumers.get(region.number, {}))
    return len(pairs), len(regions)


def measure(target: list[dict], golden: list[dict]) -> tuple[float, float, int, int]:
    """(seconds, peak MiB allocated beyond the records, pairs, regions): timed without
    tracemalloc, then run again under it for the memory."""
    start = time.perf_counter()
    pairs, regions = _run(target, golden)
    took = time.perf_counter() - start
    tracemalloc.start()
    _run(target, golden)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return took, peak / 2**20, pairs, regions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    golden = records(args.records, EAGER)
    same = records(args.records, EAGER)
    fused = records(args.records, FUSED)
    for label, target in (("identical", same), ("regions", fused)):
        took, peak, pairs, regions = measure(target, golden)
        print(f"{label:10s} target {len(target)} / golden {len(golden)} records: {took:.2f} s, "
              f"peak {peak:.0f} MiB beyond the records, {pairs} pairs, {regions} regions")


if __name__ == "__main__":
    main()
