"""A small normalized fingerprint of the records opdiff writes for the benchmark models.

`tests/capture/test_records_unchanged.py` compares the records of today's code with the
fingerprint committed in `tests/capture/data/records_fingerprint.json`, written by this script
from the code of the commit it names. A change to what capture records (a name, a kind, a
descriptor, a producer, a leaf, a statistic, a call site) fails that test; regenerate only for a
change that is meant, and say so in the commit:

    PYTHONPATH=src python tests/capture/records_fingerprint.py --write

Per record, one short line: a hash of everything but the statistics' floats and the run's
paths, pids and timings (so names, kinds, phases, modules, descriptors, dtypes, shapes, nan/inf
counts, leaves, producers, stack ids, errors), and a weighted sum of its tensors' max, min and
norm with the order of magnitude of its terms (kept for people reading a diff of the file).
Stacks are reduced to each frame's function and code in benchmarks/ (no file, no line).

Only what is exact by construction is compared with the committed file: the hashes, names, call
sites and file counts. The statistics' floats are not: another CPU's kernels (oneDNN picks its
convolution algorithm by instruction set) change a BatchNorm bias's gradient after an optimizer
step in its fourth digit. They are checked against a reference made on the same machine in the
same test instead (`statistics_problems`): the float64 statistics of the very tensors, saved by a
run of the same case with task="tensor" (capture observes: both runs compute the same values).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DATA = HERE / "data" / "records_fingerprint.json"
sys.path.insert(0, str(REPO / "benchmarks"))

# (case name, workload, level, task): mix at statistics on every benchmark model, L2 (aten ops,
# backward ones included) and the tensor task on the smaller ones.
CASES = [
    ("mlp-mix", "mlp", "mix", "statistics"),
    ("cnn-mix", "cnn", "mix", "statistics"),
    ("transformer-mix", "transformer", "mix", "statistics"),
    ("llama-mix", "llama", "mix", "statistics"),
    ("gpt2-mix", "gpt2", "mix", "statistics"),
    ("mlp-L2", "mlp", "L2", "statistics"),
    ("transformer-L2", "transformer", "L2", "statistics"),
    ("mlp-L1-tensor", "mlp", "L1", "tensor"),
]
_FLOATS = ("max", "min", "norm")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_DROPPED = {"stats", "path", "file", "pid", "time", "elapsed", "wall_s", "host_s"}


def _workload(name: str):
    import models
    from bench_per_op import tiny_mlp
    if name == "mlp":
        torch.manual_seed(0)
        model, x = tiny_mlp(), torch.randn(4, 16)
        return model, (x,), lambda m, b: m(b[0]).square().mean()
    return getattr(models, f"{name}_workload")()


def _round(v) -> object:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v != 0:
        return float(f"{v:.6g}")
    return v


def _strip(value, floats: list):
    """The record without its statistics' floats (appended to `floats`) and run-specific fields."""
    if isinstance(value, dict):
        stats = value.get("stats")
        if isinstance(stats, dict):
            floats.extend(_round(stats.get(k)) for k in _FLOATS)
            counts = [stats.get("nan"), stats.get("inf")]
        else:
            counts = [stats]
        out = {k: _strip(v, floats) for k, v in sorted(value.items()) if k not in _DROPPED}
        if "stats" in value:
            out["stats"] = counts
        return out
    if isinstance(value, list):
        return [_strip(v, floats) for v in value]
    if isinstance(value, str) and " at 0x" in value:     # an object's repr: its address
        return _ADDRESS.sub(" at 0x?", value)
    return value


def _digest(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def _row(record: dict) -> str:
    """"<hash> <weighted sum> <exponent of the sum of its terms' magnitudes>" of one record."""
    floats: list = []
    digest = _digest(_strip(record, floats))[:8]
    total = scale = 0.0
    for j, v in enumerate(floats):
        if isinstance(v, float) and math.isfinite(v):
            w = 1.0 + 0.37 * j
            total += w * v
            scale += w * abs(v)
    exponent = math.floor(math.log10(scale)) if scale > 0 else -99
    return f"{digest} {total:.7g} {exponent}"


def record_rows(rank_dir: Path) -> dict:
    """{"records": [row, ...], "names": hash, "count", "stacks": hash, "tensor_files"} of one
    step's dump, and the names of its records."""
    rows, names = [], []
    for line in (rank_dir / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        rows.append(_row(record))
        names.append(record.get("name"))
    stacks = []
    for line in (rank_dir / "stacks.jsonl").read_text().splitlines():
        entry = json.loads(line)
        stacks.append([entry["id"], [[f.get("function"), f.get("code")] for f in entry["frames"]
                                     if "benchmarks" in (f.get("file") or "")]])
    tensors = sorted(p.name for p in (rank_dir / "tensors").glob("*")) \
        if (rank_dir / "tensors").is_dir() else []
    return {"records": rows, "names": _digest(names), "count": len(names), "stacks": _digest(stacks),
            "tensor_files": len(tensors)}, names


def run_case(case: tuple, root: Path, opdiff_module=None) -> tuple[dict, list]:
    """Record one training step of the case's model (second step: the first warms up) and
    fingerprint it."""
    import opdiff
    from models import captured_step
    opdiff = opdiff_module or opdiff
    _, workload, level, task = case
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, batch, loss_fn = _workload(workload)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        dbg = opdiff.PrecisionDebugger(dump_path=str(root / case[0]), task=task, level=level,
                                       step=[1])
        for _ in range(2):
            captured_step(dbg, model, batch, loss_fn, opt)
    finally:
        torch.set_num_threads(threads)
    return record_rows(root / case[0] / "step1" / "rank0")


def fingerprint(cases=CASES) -> dict:
    with tempfile.TemporaryDirectory(prefix="opdiff-fingerprint-") as root:
        return {case[0]: run_case(case, Path(root))[0] for case in cases}


def differences(expected: dict, found: dict, names: list) -> list:
    """What differs between two fingerprints of one case, in words (empty: the same); `names`:
    the found records' names. Statistics are not compared here (see `statistics_problems`)."""
    problems = []
    if expected["count"] != found["count"] or expected["names"] != found["names"]:
        problems.append(f"the record names changed ({found['count']} records, were "
                        f"{expected['count']})")
    for i, (a, b) in enumerate(zip(expected["records"], found["records"])):
        if a.split()[0] != b.split()[0]:
            problems.append(f"record {i} {names[i]}: its content (other than statistics) changed")
        if len(problems) >= 5:
            break
    if expected["stacks"] != found["stacks"]:
        problems.append("the call sites in stacks.jsonl changed")
    if expected["tensor_files"] != found["tensor_files"]:
        problems.append(f"{found['tensor_files']} tensor files, were {expected['tensor_files']}")
    return problems


def _described(value, path=()):
    """(path, descriptor) of every tensor descriptor with statistics in a record, in order."""
    if isinstance(value, dict):
        if isinstance(value.get("stats"), dict):
            yield path, value
        for k, v in sorted(value.items()):
            if k != "stats":
                yield from _described(v, (*path, k))
    elif isinstance(value, list):
        for j, v in enumerate(value):
            yield from _described(v, (*path, j))


def _reference(tensor) -> dict:
    """max, min, mean and norm of a tensor, in float64."""
    x = tensor.detach().to(torch.float64).reshape(-1)
    x = x[torch.isfinite(x)]
    if x.numel() == 0:
        return {}
    return {"max": x.max().item(), "min": x.min().item(), "mean": x.mean().item(),
            "norm": x.norm().item()}


def statistics_problems(stats_dir: Path, tensor_dir: Path, rel: float = 1e-5) -> tuple[list, int]:
    """Each statistic the run in `stats_dir` recorded against the float64 statistics of the same
    tensor saved by a task="tensor" run of the same case in `tensor_dir`, on this machine: the
    problems in words and how many tensors were checked. A statistic agrees within `rel` of the
    tensor's magnitude (its largest absolute value; its norm for the norm): float32 reductions
    round, float64 ones are the reference."""
    from opdiff.store.reader import open_dump
    saved = open_dump(tensor_dir)
    ours = [json.loads(x) for x in (stats_dir / "records.jsonl").read_text().splitlines()]
    theirs = [json.loads(x) for x in (tensor_dir / "records.jsonl").read_text().splitlines()]
    if [r.get("name") for r in ours] != [r.get("name") for r in theirs]:
        return ["the statistics and tensor runs recorded other records"], 0
    problems, checked = [], 0
    for record, twin in zip(ours, theirs):
        keyed = {path: d.get("key") for path, d in _described(twin)}
        for path, desc in _described(record):
            key = keyed.get(path)
            if not key or not str(desc.get("dtype", "")).startswith(("float", "bfloat")):
                continue
            reference = _reference(saved.tensor(key))
            if not reference:
                continue
            checked += 1
            size = max(abs(reference["max"]), abs(reference["min"]))
            for stat, want in reference.items():
                got = desc["stats"].get(stat)
                scale = reference["norm"] if stat == "norm" else size
                if not isinstance(got, (int, float)) or abs(got - want) > rel * scale + 1e-30:
                    problems.append(f"{record['name']} {'.'.join(map(str, path))}: {stat} {got}, "
                                    f"its tensor's is {want:.10g}")
            if len(problems) >= 5:
                return problems, checked
    return problems, checked


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="write the records fingerprint of this code")
    parser.add_argument("--write", action="store_true", help=f"write {DATA.relative_to(REPO)}")
    args = parser.parse_args(argv)
    result = fingerprint()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    doc = {"generated_from": commit, "torch": torch.__version__, "cases": result}
    text = json.dumps(doc, separators=(",", ":"))
    if args.write:
        DATA.parent.mkdir(exist_ok=True)
        DATA.write_text(text + "\n")
    print(f"{len(text)} bytes; " + ", ".join(f"{k}: {v['count']} records"
                                             for k, v in result.items()))


if __name__ == "__main__":
    main()
