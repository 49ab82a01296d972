"""Running a check over a whole dump: filters, parallel workers, resuming.

    result = check_dump("./dump/npu", jobs=4, progress_file="./out/check_progress.jsonl")

With `jobs` > 1 the ops are split across worker processes (spawn context: no forked torch
state); each worker opens the dump by its path and checks its share. With `engine="ray"` the
same batches run as Ray tasks (`opdiff.check.ray_tasks`); the verdicts are the same either way. With `progress_file`
each op's verdict is appended as one JSON line as soon as it is known, and ops already in the
file are not replayed again (`--resume`).
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..comparison.verdicts import Policy
from ..comparison.workers import watch_parent
from ..errors import ConfigError, DumpError
from ..store.reader import find_dumps, open_dump
from ..store.schema import Kind
from .device import usable_device
from .engine import CheckResult, OpCheck, check_record, location_of, select
from .inputs import SyntheticTensors, with_synthetic_keys

log = logging.getLogger("opdiff")


def _open(path: str | os.PathLike[str]) -> Any:
    found = find_dumps(path)
    if not found:
        raise DumpError(f"{path}: no opdiff dump in it (no records.jsonl)")
    if len(found) > 1:
        raise ConfigError(f"{path}: holds {len(found)} step/rank dumps; check one of them "
                          f"(e.g. {found[0]})")
    return open_dump(found[0])


class CheckJob:
    """What one process (the driver, a `--jobs` worker, a Ray worker) needs to check records
    of one dump: the dump opened by its path, its records, the loader and the device."""

    def __init__(self, path: str, device: Optional[str]):
        self.dump = _open(path)
        # Checked here, in every process: an extension's device (npu) is imported where it runs.
        self.device = usable_device(device) if device is not None else None
        records = list(self.dump.records())
        self.mode = "tensor" if self.dump.holds_tensors else "statistics"
        if self.mode == "statistics":
            records = with_synthetic_keys(records)
            self.load: Callable[[str], Any] = SyntheticTensors(records)
        else:
            self.load = self.dump.tensor
        self.records = records
        self.by_name = {r["name"]: r for r in records}
        self.index = {r["name"]: i for i, r in enumerate(records)}
        self.policy = Policy()
        self.known: dict[str, Any] = {}      # record -> the autocast that reproduces it

    def check(self, name: str) -> OpCheck:
        """The verdict on one record of the dump."""
        rec = self.by_name[name]
        return check_record(rec, self.by_name, self.load, self.index[name], self.policy,
                            device=self.device if self.mode == "statistics" else None,
                            location=location_of(self.dump, rec, self.by_name), known=self.known)


_WORKER: Optional[CheckJob] = None


def _worker_init(path: str, device: Optional[str]) -> None:
    global _WORKER
    import torch
    torch.set_num_threads(1)        # jobs processes share the cores
    _WORKER = CheckJob(path, device)


def _worker_check(names: list[str]) -> list[dict[str, Any]]:
    assert _WORKER is not None
    return [_WORKER.check(n).to_dict() for n in names]


def load_progress(progress_file: str | os.PathLike[str]) -> dict[str, OpCheck]:
    """{record name: verdict} already written to a progress file (a torn last line is skipped)."""
    done: dict[str, OpCheck] = {}
    path = Path(progress_file)
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            op = OpCheck.from_dict(json.loads(line))
        except (json.JSONDecodeError, TypeError, KeyError):
            continue
        done[op.name] = op
    return done


def check_dump(path: str | os.PathLike[str], device: Optional[str] = None,
               names: Iterable[str] = (), scope: Iterable[str] = (), jobs: int = 1,
               progress_file: Optional[str | os.PathLike[str]] = None, resume: bool = False,
               on_total: Optional[Callable[[int], None]] = None,
               on_done: Optional[Callable[[OpCheck], None]] = None, engine: str = "local",
               ray_address: Optional[str] = None) -> CheckResult:
    """Check every op record of one step/rank dump (compiled kernels are listed as not checked) (see `opdiff.check`).

    device: run the ops there (required for statistics dumps, which hold no outputs to judge).
    names/scope: `--list`/`--scope` filters. jobs: worker processes. progress_file: append each
    verdict there; resume: skip the records already in it. on_total/on_done: progress hooks.
    engine: "local" (this machine, `jobs` processes) or "ray" (Ray tasks on the cluster at
    `ray_address`, "auto" or "host:6379"; None starts a local one; `jobs` is then unused).
    Raises DumpError/ConfigError (or the Ray engine's EngineError) for bad input (the CLI
    exits 2)."""
    start = time.perf_counter()
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine must be 'local' or 'ray', not {engine!r}")
    job = CheckJob(os.fspath(path), device)
    device = job.device
    if job.mode == "statistics" and device is None and \
            (job.dump.meta.get("config") or {}).get("task") == "tensor":
        cut = job.dump.cut() if hasattr(job.dump, "cut") else None     # (disk full, killed)
        raise DumpError(f"{path}: a tensor dump whose tensors are missing (no readable shard in "
                        f"its {job.dump.path.name}/tensors"
                        + (f"; {cut['why']} at record {cut['records']}" if cut else "") +
                        "): nothing to judge; dump again, or check it on the device with "
                        "--device DEV (ops re-run there on random inputs)")
    if job.mode == "statistics" and device is None:
        raise ConfigError(f"{path}: a statistics dump holds no tensors to judge; check it on "
                          "the device with --device DEV (ops re-run there on random inputs "
                          "within the dumped ranges), or dump with task='tensor'")
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1; got {jobs}")
    # (compiled kernels are replayed from the programs stored with them: engine.check_kernel)
    chosen = [r["name"] for r in select(job.records, names, scope)
              if r["kind"] in Kind.OPS]
    done = load_progress(progress_file) if (resume and progress_file) else {}
    todo = [n for n in chosen if n not in done]
    if on_total:
        on_total(len(chosen))
    results: dict[str, OpCheck] = {n: done[n] for n in chosen if n in done}
    sink = open(progress_file, "a" if resume else "w") if progress_file else None

    def finish(op: OpCheck) -> None:
        results[op.name] = op
        if sink is not None:
            sink.write(json.dumps(op.to_dict()) + "\n")
            sink.flush()
        if on_done:
            on_done(op)

    try:
        for op in done.values():
            if on_done and op.name in results:
                on_done(op)
        if engine == "ray" and todo:
            from .ray_tasks import check_on_ray
            check_on_ray(os.fspath(path), device, todo, finish, address=ray_address)
        elif jobs == 1 or len(todo) < 2:
            for name in todo:
                finish(job.check(name))
        else:
            _parallel(os.fspath(path), device, todo, jobs, finish)
    finally:
        if sink is not None:
            sink.close()
    ops = sorted(results.values(), key=lambda o: o.index)
    notes = []
    if job.mode == "statistics":
        notes.append(f"statistics dump: each op re-run on {device} on random inputs within the "
                     "dumped ranges (not the run's own values)")
    elif device is not None:
        notes.append(f"--device {device} not used: the dump holds the run's own outputs, which are "
                     "the target (--device re-runs the ops of statistics dumps)")
    if done:
        notes.append(f"resumed: {len([n for n in chosen if n in done])} op(s) from {progress_file}")
    return CheckResult(dump=str(job.dump.path), ops=ops, mode=job.mode,
                       device=device if job.mode == "statistics" else None,
                       notes=notes, seconds=time.perf_counter() - start)


def _parallel(path: str, device: Optional[str], todo: list[str], jobs: int,
              finish: Callable[[OpCheck], None]) -> None:
    ctx = multiprocessing.get_context("spawn")
    init = (os.getpid(), f"{__name__}:_worker_init", path, device)   # they die with this process
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=watch_parent,
                             initargs=init) as pool:
        futures = [pool.submit(_worker_check, b) for b in batches(todo, jobs)]
        for fut in as_completed(futures):
            for d in fut.result():
                finish(OpCheck.from_dict(d))


def batches(todo: list[str], workers: int) -> list[list[str]]:
    """Small batches in execution order (about four per worker, at most 16 ops each), so that
    expensive ops (big convs) spread across the workers."""
    size = max(1, min(16, len(todo) // (max(workers, 1) * 4) or 1))
    return [todo[i:i + size] for i in range(0, len(todo), size)]
