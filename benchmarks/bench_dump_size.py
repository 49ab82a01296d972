"""Tensor dump size: what fills a `task="tensor"` dump, and what references to views save.

    python benchmarks/bench_dump_size.py [--models cnn,transformer,llama] [--level L1]
                                         [--rounds 5] [--top 15] [--no-hash]

Per model, one training step (forward, backward, SGD step) is dumped twice, with references to
views on and off (`DumpWriter.references`), and the two dumps are checked to read back the same
tensors. Printed: bytes on disk; the tensor bytes by role, by phase and by op (largest first) of
the dump without references, and how many of them each way of saving less would remove:

- "views": tensors stored as references to the saved tensor whose bytes they view (what the
  writer does);
- "same bytes": further tensors whose bytes equal, byte for byte, another saved tensor's (found
  here with a blake2b hash of every tensor; the hashing time is printed, per MB, to tell what
  doing it at capture would cost).

Then the captured step time with references on and off, alternating in one process
(torch.set_num_threads(1), median of `--rounds` after a warm-up).
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


def dump_step(workload, path: Path, level: str, references: bool) -> float:
    """Dump one training step into path; the captured step's seconds."""
    model, batch, loss_fn = workload()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    old, DumpWriter.references = DumpWriter.references, references
    try:
        t0 = time.perf_counter()
        dbg = opdiff.PrecisionDebugger(dump_path=str(path), level=level, task="tensor")
        dbg.start(model)
        opt.zero_grad(set_to_none=True)
        loss_fn(model, batch).backward()
        opt.step()
        dbg.stop()
        dbg.step()
        return time.perf_counter() - t0
    finally:
        DumpWriter.references = old


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def analyse(plain_dir: Path, ref_dir: Path, top: int, hashing: bool) -> dict:
    """Bytes by role / phase / op of the plain dump, what references and equal bytes remove."""
    plain, refd = open_dump(plain_dir), open_dump(ref_dir)
    pindex, rindex = plain._index(), refd._index()
    by = {"role": collections.Counter(), "phase": collections.Counter(), "op": collections.Counter()}
    views = collections.Counter()
    owner: dict[str, tuple[str, str, str]] = {}
    for record in plain.records():
        for _, role, desc in iter_tensors(record):
            key = desc.get("key")
            if key is None or key in owner or key not in pindex:
                continue
            owner[key] = (record["op"], role, record.get("phase") or "")
    total = 0
    for key, (op, role, phase) in owner.items():
        n = pindex[key].nbytes
        total += n
        by["role"][role] += n
        by["phase"][phase] += n
        by["op"][f"{op} {role} {phase}"] += n
        if isinstance(rindex.get(key), _Ref):
            views[f"{op} {role} {phase}"] += n
    mismatched = [k for k in owner if not _same(plain.tensor(k), refd.tensor(k))]
    dup_bytes, hash_s, hashed = 0, 0.0, 0
    dups: collections.Counter = collections.Counter()
    if hashing:
        seen: dict[bytes, str] = {}
        for key, (op, role, phase) in owner.items():
            if isinstance(rindex.get(key), _Ref):
                continue
            t = plain.tensor(key)
            data = _bits(t).numpy()
            t0 = time.perf_counter()
            digest = hashlib.blake2b(memoryview(data), digest_size=16).digest() + bytes(str(t.dtype), "ascii")
            hash_s += time.perf_counter() - t0
            hashed += data.nbytes
            if digest in seen:
                dup_bytes += data.nbytes
                dups[f"{op} {role} {phase}"] += data.nbytes
            else:
                seen[digest] = key
    return {"total": total, "by": by, "views": views, "dups": dups, "dup_bytes": dup_bytes,
            "hash_s_per_mb": hash_s / max(hashed / MB, 1e-9), "mismatched": mismatched,
            "tensors": len(owner), "refs": sum(isinstance(e, _Ref)
                                               for e in rindex.values())}


def _same(a, b) -> bool:
    return (a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b)))


def timing(workload, root: Path, level: str, rounds: int) -> tuple[float, float]:
    """Median captured-step seconds with references on and off, alternating (after a warm-up)."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds + 1):
        for refs in (False, True):
            path = root / f"t{i}-{refs}"
            took = dump_step(workload, path, level, refs)
            shutil.rmtree(path, ignore_errors=True)
            if i:
                times[refs].append(took)
    return statistics.median(times[False]), statistics.median(times[True])


def report(name: str, level: str, plain: int, refd: int, a: dict, top: int, t_off: float, t_on: float) -> None:
    print(f"\n== {name} ({level}, task=tensor): {a['tensors']} saved tensors, {a['total'] / MB:.1f} MB")
    print(f"on disk: {plain / MB:.1f} MB without references, {refd / MB:.1f} MB with "
          f"({a['refs']} references, {100 * (1 - refd / plain):.1f}% less)")
    print(f"read back the same: {'yes' if not a['mismatched'] else 'NO: ' + ', '.join(a['mismatched'][:3])}")
    view_bytes = sum(a["views"].values())
    print(f"views (references): {view_bytes / MB:.1f} MB = {100 * view_bytes / a['total']:.1f}% of tensor bytes")
    if a["hash_s_per_mb"]:
        print(f"same bytes as another saved tensor, beyond views: {a['dup_bytes'] / MB:.1f} MB = "
              f"{100 * a['dup_bytes'] / a['total']:.1f}%; blake2b costs {1e3 * a['hash_s_per_mb']:.2f} ms/MB")
    for what in ("role", "phase"):
        print(f"by {what}: " + ", ".join(f"{k} {v / MB:.1f} MB" for k, v in a["by"][what].most_common()))
    print("largest by op (MB: all, views, same bytes):")
    for k, v in a["by"]["op"].most_common(top):
        print(f"  {v / MB:8.1f} {a['views'][k] / MB:8.1f} {a['dups'][k] / MB:8.1f}  {k}")
    if t_off:
        print(f"captured step: {1e3 * t_off:.0f} ms without references, {1e3 * t_on:.0f} ms with "
              f"({t_on / t_off:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,transformer,llama")
    ap.add_argument("--level", default="L1")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (0: sizes only)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--no-hash", action="store_true", help="skip the equal-bytes search")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="opdiff-dump-size-"))
    try:
        for name in args.models.split(","):
            workload = WORKLOADS[name]
            pdir, rdir = root / f"{name}-plain", root / f"{name}-refs"
            dump_step(workload, pdir, args.level, False)
            dump_step(workload, rdir, args.level, True)
            step = "step0/rank0"
            a = analyse(pdir / step, rdir / step, args.top, not args.no_hash)
            t_off, t_on = timing(workload, root, args.level, args.rounds) if args.rounds else (0.0, 0.0)
            report(name, args.level, disk_bytes(pdir), disk_bytes(rdir), a, args.top, t_off, t_on)
            shutil.rmtree(pdir, ignore_errors=True)
            shutil.rmtree(rdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
