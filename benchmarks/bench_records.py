"""What filling a record's defaults once where a dump is read costs (`store.schema.complete`).

    python benchmarks/bench_records.py [--records 200000] [--repeat 5]

Lines of records.jsonl as capture writes an L1 op (seq, name, op, kind, phase, module, inputs,
outputs, stack; no kwargs or parameters) are read the way `Dump.records()` reads them: parsed and
checked (`record_problem`), then completed. Reports the median and spread of the parse+check time
and of `complete` alone over the same records, side by side in one process, and the memory
`complete` adds to the records (tracemalloc).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc

from opdiff.store.records import record_problem
from opdiff.store.schema import complete


def lines(n: int) -> list[bytes]:
    tensor = {"type": "tensor", "dtype": "float32", "shape": [2, 128, 512],
              "stats": {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 3.0, "nan": 0, "inf": 0}}
    return [json.dumps({"seq": i, "name": f"Functional.linear.{i}.forward", "op": "Functional.linear",
                        "kind": "api", "phase": "forward", "module": "Module.model.Model.forward.0",
                        "inputs": [tensor, tensor], "outputs": [tensor], "stack": 1}).encode()
            for i in range(n)]


def read(raw: list[bytes]) -> tuple[list[dict], float]:
    start = time.perf_counter()
    out = []
    for line in raw:
        record = json.loads(line)
        if record_problem(record) is not None:
            raise SystemExit("not a record")
        out.append(record)
    return out, time.perf_counter() - start


def fill(records: list[dict]) -> float:
    start = time.perf_counter()
    for record in records:
        complete(record)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    raw = lines(args.records)
    parse, completing = [], []
    for _ in range(args.repeat):
        records, took = read(raw)
        parse.append(took)
        completing.append(fill(records))
        del records
    records, _ = read(raw)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fill(records)
    added = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    tracemalloc.start()
    held, _ = read(raw)
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held

    def show(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.3f} s (spread {min(xs):.3f}-{max(xs):.3f})"

    print(f"{args.records} records, {args.repeat} runs")
    print(f"parse + check : {show(parse)}")
    print(f"complete      : {show(completing)}, "
          f"{statistics.median(completing) / statistics.median(parse):.1%} of parse + check, "
          f"{statistics.median(completing) / args.records * 1e9:.0f} ns a record")
    print(f"memory        : records {size / 2**20:.0f} MiB, complete adds {added / 2**20:.0f} MiB "
          f"({added / size:.1%})")


if __name__ == "__main__":
    main()
