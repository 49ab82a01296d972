"""Tensor dump size: what fills a `task="tensor"` dump, and what references to views save.

    python benchmarks/bench_dump_size.py [--models cnn,transformer,llama] [--level L1]
                                         [--rounds 5] [--top 15] [--no-hash]

Per model, one training step (forward, backward, SGD step) is dumped three times: without
references (`DumpWriter.references = False`), with references to views only
(`DumpWriter.same_bytes = False`) and with both kinds (the default); the three are checked to
read back the same tensors. Printed: bytes on disk; the tensor bytes by role, by phase and by op
(largest first) of the dump without references, and what each kind of reference removed:

- "views": tensors viewing the memory of a saved tensor, unchanged (view, transpose, reshape,
  expand, getitem outputs);
- "same bytes": further tensors holding the very bytes of one written before (copies, zeros).
  As a check of the writer's sampled search, every tensor of the views-only dump is hashed
  (blake2b): the bytes it finds repeated should be what the writer found; the hashing time per
  MB says what hashing everything at capture would have cost instead.

Then the captured step time of each, alternating in one process (torch.set_num_threads(1),
median of `--rounds` after a warm-up).
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

import opdiff  # noqa: E402
from opdiff.store import iter_tensors, open_dump  # noqa: E402
from opdiff.store.reader import _Ref  # noqa: E402
from opdiff.store.writer import DumpWriter  # noqa: E402

MB = 1e6


def llama_workload(batch: int = 4, seq: int = 64):
    """A two-layer Llama from transformers with random weights (none downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=seq)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, 1000, (batch, seq))
    return model, (tokens,), lambda m, b: m(input_ids=b[0], labels=b[0]).loss


WORKLOADS = {"cnn": models.cnn_workload, "transformer": models.transformer_workload,
             "llama": llama_workload}


MODES = {"none": (False, False), "views": (True, False), "all": (True, True)}


def dump_step(workload, path: Path, level: str, mode: str) -> tuple[float, float]:
    """Dump one training step into path with references `mode`; the captured step's wall and
    CPU seconds (this process's; on a shared machine the CPU time is the steadier of the two)."""
    model, batch, loss_fn = workload()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    old = DumpWriter.references, DumpWriter.same_bytes
    DumpWriter.references, DumpWriter.same_bytes = MODES[mode]
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        dbg = opdiff.PrecisionDebugger(dump_path=str(path), level=level, task="tensor")
        models.captured_step(dbg, model, batch, loss_fn, opt)
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        DumpWriter.references, DumpWriter.same_bytes = old


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def analyse(dirs: dict[str, Path], hashing: bool) -> dict:
    """Bytes by role / phase / op of the dump without references, what each kind removed."""
    dumps = {mode: open_dump(d) for mode, d in dirs.items()}
    plain = dumps["none"]
    pindex = plain._index()
    vindex, aindex = dumps["views"]._index(), dumps["all"]._index()
    by = {"role": collections.Counter(), "phase": collections.Counter(), "op": collections.Counter()}
    views, same = collections.Counter(), collections.Counter()
    names = {mode: [(r["name"], [d.get("key") for _, _, d in iter_tensors(r)]) for r in dump.records()]
             for mode, dump in dumps.items()}
    owner: dict[str, tuple[str, str, str]] = {}
    for record in plain.records():
        for _, role, desc in iter_tensors(record):
            key = desc.get("key")
            if key is not None and key not in owner and key in pindex:
                owner[key] = (record["op"], role, record.get("phase") or "")
    total = 0
    for key, (op, role, phase) in owner.items():
        n, row = pindex[key].nbytes, f"{op} {role} {phase}"
        total += n
        by["role"][role] += n
        by["phase"][phase] += n
        by["op"][row] += n
        views[row] += n if isinstance(vindex.get(key), _Ref) else 0
        same[row] += n if isinstance(aindex.get(key), _Ref) and not isinstance(vindex.get(key), _Ref) else 0
    mismatched = []
    for mode in ("views", "all"):     # record by record: the same tensors (keys may differ a little)
        for (name, ka), (_, kb) in zip(names["none"], names[mode]):
            for i, (a, b) in enumerate(zip(ka, kb)):
                if (a or b) and not _same(plain.tensor(a), dumps[mode].tensor(b)):
                    mismatched.append(f"{mode}: {name} #{i}")
    dup_bytes, hash_s, hashed = 0, 0.0, 0
    if hashing:
        seen: set[bytes] = set()
        views_dump = dumps["views"]
        for key, entry in vindex.items():
            if isinstance(entry, _Ref):
                continue
            t = views_dump.tensor(key)
            data = _bits(t).numpy()
            t0 = time.perf_counter()
            digest = hashlib.blake2b(memoryview(data), digest_size=16).digest() + str(t.dtype).encode()
            hash_s += time.perf_counter() - t0
            hashed += data.nbytes
            if digest in seen and data.nbytes >= 256:
                dup_bytes += data.nbytes
            seen.add(digest)
    return {"total": total, "by": by, "views": views, "same": same, "dup_bytes": dup_bytes,
            "hash_s_per_mb": hash_s / max(hashed / MB, 1e-9), "mismatched": mismatched,
            "tensors": len(owner), "refs": {m: sum(isinstance(e, _Ref) for e in dumps[m]._index().values())
                                            for m in ("views", "all")}}


def _same(a, b) -> bool:
    return (a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b)))


def timing(workload, root: Path, level: str, rounds: int) -> dict[str, tuple[float, float]]:
    """Median captured-step (wall, CPU) seconds per mode; the modes alternate, their order
    rotating from round to round, after a warm-up round."""
    times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    modes = list(MODES)
    for i in range(rounds + 1):
        for mode in modes[i % 3:] + modes[:i % 3]:
            path = root / f"t{i}-{mode}"
            took = dump_step(workload, path, level, mode)
            shutil.rmtree(path, ignore_errors=True)
            if i:
                times[mode].append(took)
    return {mode: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
            for mode, t in times.items()}


def report(name: str, level: str, disk: dict[str, int], a: dict, top: int,
           times: dict[str, tuple[float, float]]) -> None:
    print(f"\n== {name} ({level}, task=tensor): {a['tensors']} saved tensors, {a['total'] / MB:.1f} MB")
    print(f"on disk: {disk['none'] / MB:.1f} MB without references, {disk['views'] / MB:.1f} MB with "
          f"references to views ({a['refs']['views']}), {disk['all'] / MB:.1f} MB with those to "
          f"equal bytes too ({a['refs']['all']}): {100 * (1 - disk['all'] / disk['none']):.1f}% less")
    print(f"read back the same: {'yes' if not a['mismatched'] else 'NO: ' + ', '.join(a['mismatched'][:3])}")
    view_bytes, same_bytes = sum(a["views"].values()), sum(a["same"].values())
    print(f"views: {view_bytes / MB:.1f} MB = {100 * view_bytes / a['total']:.1f}%; same bytes: "
          f"{same_bytes / MB:.1f} MB = {100 * same_bytes / a['total']:.1f}% of tensor bytes")
    if a["hash_s_per_mb"]:
        print(f"hashing every tensor of the views-only dump finds {a['dup_bytes'] / MB:.1f} MB repeated "
              f"(tensors of 256 bytes or more); blake2b costs {1e3 * a['hash_s_per_mb']:.2f} ms/MB")
    for what in ("role", "phase"):
        print(f"by {what}: " + ", ".join(f"{k} {v / MB:.1f} MB" for k, v in a["by"][what].most_common()))
    print("largest by op (MB: all, views, same bytes):")
    for k, v in a["by"]["op"].most_common(top):
        print(f"  {v / MB:8.1f} {a['views'][k] / MB:8.1f} {a['same'][k] / MB:8.1f}  {k}")
    if times:
        print("captured step, wall / CPU: " + ", ".join(f"{mode} {1e3 * w:.0f} / {1e3 * c:.0f} ms"
                                                      for mode, (w, c) in times.items())
              + f"; all/none {times['all'][0] / times['none'][0]:.2f}x wall, "
              f"{times['all'][1] / times['none'][1]:.2f}x CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,transformer,llama")
    ap.add_argument("--level", default="L1")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (0: sizes only)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--no-hash", action="store_true", help="skip the hashing check")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="opdiff-dump-size-"))
    try:
        for name in args.models.split(","):
            workload = WORKLOADS[name]
            dirs = {mode: root / f"{name}-{mode}" for mode in MODES}
            for mode, path in dirs.items():
                dump_step(workload, path, args.level, mode)
            disk = {mode: disk_bytes(path) for mode, path in dirs.items()}
            a = analyse({mode: path / "step0/rank0" for mode, path in dirs.items()}, not args.no_hash)
            times = timing(workload, root, args.level, args.rounds) if args.rounds else {}
            report(name, args.level, disk, a, args.top, times)
            for path in dirs.values():
                shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
