"""Replay: re-run dumped ops in float64 on the target's own data to measure each op's own error.

Comparing with golden shows the error a tensor has accumulated; an op's *local* error, free of
anything its inputs inherited, shows only when the op is re-run on exactly the inputs the target
gave it. A healthy bf16 run's gradients may differ from fp32 golden by 10% or more after a few
BatchNorm backwards, hiding a kernel that is off by 1%; replayed, that kernel stands out.

    from opdiff.comparison.replay import Replayer
    from opdiff.store.reader import open_dump
    dump = open_dump("./dump/bf16/step0/rank0")          # needs task="tensor"
    replayer = Replayer(dump)
    local = replayer.judge("Functional.batch_norm.1.backward")
    local.culprit, local.describe()

The compare engine calls this for the ops it needs (see `opdiff.comparison.blame`); the rules
are in `opdiff.comparison.replay.local`, the call rebuilding in `opdiff.comparison.replay.calls`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional

from ...store.schema import Kind, Record
from ..workers import watch_parent
from .calls import NotReplayable, rebuild_call, resolve
from .chain import ChainError, Readers, replay_region
from .local import LocalError, TensorLocalError, replay_record

if TYPE_CHECKING:
    from ..verdicts import Policy

log = logging.getLogger("opdiff")


class Replayer:
    """Replays records of one opened dump on demand and remembers the verdicts.

    records: the dump's records when already read (saves reading records.jsonl again).
    policy: an `opdiff.comparison.verdicts.Policy` for the dtype tolerances (default thresholds).
    shortcut: run the reference kernel only where the float64 result alone cannot settle the
    verdict (`opdiff.comparison.replay.rules.settle`: the same verdicts, a healthy op passes
    without it); False runs it for every output (what `opdiff check` reports).
    """

    def __init__(self, dump: Any, records: Optional[list[Record]] = None,
                 policy: Optional["Policy"] = None, jobs: Optional[int] = None, shortcut: bool = True):
        if policy is None:
            from ..verdicts import Policy
            policy = Policy()
        self.dump, self.policy = dump, policy
        self.records = {r["name"]: r for r in (records if records is not None else dump.records())}
        self.done: dict[str, LocalError] = {}
        self.autocast: dict[str, Any] = {}     # record -> CPU autocast dtype that reproduces it
        self.seconds = 0.0
        self.jobs = replay_jobs() if jobs is None else max(1, jobs)
        self._pool: Any = None
        self.shortcut = shortcut
        # `prefetch`: a thread replaying ahead; `judge` claims a record before replaying it, so
        # no record is replayed twice and the walk waits for one a thread has in hand
        self._cond = threading.Condition()
        self._claimed: set[str] = set()
        self._queue: list[str] = []
        self._ahead: Optional[threading.Thread] = None
        self._stop = False
        self._asked: set[str] = set()       # what judge / judge_many were asked for
        self.regions: dict[str, LocalError] = {}    # region name -> its chain's verdict
        self._readers: Optional[Readers] = None     # (built for the first region)

    def can_replay(self, name: str) -> bool:
        """Cheap pre-check: a record of a kind that replay handles (modules and parameter
        gradients are made of other ops and are never replayed as a unit)."""
        rec = self.records.get(name)
        return rec is not None and rec["kind"] in Kind.REPLAYABLE

    def judge(self, name: str) -> LocalError:
        """The LocalError of one record (replayed once, then cached). While `prefetch`'s thread
        has this record in hand, the caller replays the next record of its queue meanwhile
        (both cores busy) and then takes the thread's verdict."""
        while True:
            with self._cond:
                self._asked.add(name)
                if name in self.done:
                    return self.done[name]
                todo = name
                if name in self._claimed:
                    other = self._next_queued()
                    if other is None:
                        self._cond.wait()
                        continue
                    todo = other
                self._claimed.add(todo)
            self._settle(todo)
            if todo == name:
                return self.done[name]

    def _settle(self, name: str) -> None:
        """Replay one claimed record and publish its verdict (the claim is dropped on error)."""
        try:
            local = self._replay(name)
        except BaseException:
            with self._cond:
                self._claimed.discard(name)
                self._cond.notify_all()
            raise
        with self._cond:
            self.done[name] = local
            self._cond.notify_all()

    def _next_queued(self) -> Optional[str]:
        """The first record of the prefetch queue nobody has claimed (under the lock)."""
        while self._queue and (self._queue[0] in self._claimed or self._queue[0] in self.done):
            self._queue.pop(0)
        return self._queue.pop(0) if self._queue else None

    def _replay(self, name: str) -> LocalError:
        rec = self.records.get(name)
        if rec is None:
            return LocalError(name, False, reason="not in the target dump")
        if rec["kind"] not in Kind.REPLAYABLE:
            return LocalError(name, False, reason=f"a {rec['kind']} record is made of other "
                                                  f"ops and is not replayed as a unit")
        start = time.perf_counter()
        fwd = self.records.get(rec.get("forward")) if rec.get("forward") else None
        local = replay_record(rec, self.dump.tensor, self.policy, forward_record=fwd,
                              known=self.autocast, shortcut=self.shortcut)
        with self._cond:
            self.seconds += time.perf_counter() - start
        log.debug("opdiff: replayed %s: %s", name,
                  local.describe() if local.replayed else local.reason)
        return local

    def judge_region(self, name: str, members: list[str]) -> LocalError:
        """The verdict of the region `name` whose target ops are the records `members` (in
        execution order), replayed as one chain (`replay.chain`; cached like `judge`'s, in
        this process)."""
        if name in self.regions:
            return self.regions[name]
        missing = next((m for m in members if m not in self.records), None)
        if missing is not None or not (getattr(self.dump, "meta", None) or {}).get("dataflow"):
            why = f"{missing} is not in the target dump" if missing else (
                "the target dump records no dataflow (which op made each input), so the "
                "chain cannot be fed")
            found: LocalError = ChainError(name, False, reason=why, ops=len(members))
        else:
            if self._readers is None:
                self._readers = Readers(list(self.records.values()))
            found = replay_region(name, [self.records[m] for m in members], self._readers,
                                  self.dump.tensor, self.policy, shortcut=self.shortcut)
        log.debug("opdiff: replayed %s as a chain: %s", name, found.describe())
        with self._cond:
            self.regions[name] = found
        return found

    def prefetch(self, names: list[str]) -> bool:
        """Replay `names` in this order on a second thread, ahead of the `judge` calls that
        will want them (the compare starts it before measuring: replay and measuring overlap,
        torch kernels release the GIL). Every replay runs on one intra-op thread and the CPU
        generator is checked under a lock (`running.rng_guard`), so each verdict is the one a
        single thread gives. False (nothing started) with OPDIFF_REPLAY_THREADS=1, one usable
        core, worker processes (`jobs` > 1) or a thread already running. `close` stops it."""
        if self._ahead is not None or self.jobs > 1 or replay_threads() < 2:
            return False
        with self._cond:
            self._queue = [n for n in dict.fromkeys(names) if self.can_replay(n)
                           and n not in self.done and n not in self._claimed]
            self._stop = False
        self._ahead = threading.Thread(target=self._run_ahead, name="opdiff-replay", daemon=True)
        self._ahead.start()
        return True

    def _run_ahead(self) -> None:
        import torch

        torch.set_num_threads(1)        # (this thread's intra-op setting: one, as every replay)
        while True:
            with self._cond:
                todo = None if self._stop else self._next_queued()
                if todo is None:
                    return
                self._claimed.add(todo)
            try:
                self._settle(todo)
            except Exception:          # the caller's judge() replays it and sees the error
                log.debug("opdiff: replay thread stopped at %s", todo, exc_info=True)
                return

    def judge_many(self, names: list[str], jobs: Optional[int] = None) -> dict[str, LocalError]:
        """The LocalErrors of several records, replayed in `jobs` processes (default
        `self.jobs`; spawn context, each worker opens the dump by its path; the pool stays up
        for the next call until `close`) and cached like `judge`'s. One process for a dump
        without a path on disk, or when fewer than two records are left to replay. The
        verdicts are the same either way (every replay runs on one thread: `replay.local`)."""
        jobs = self.jobs if jobs is None else jobs
        todo = [n for n in dict.fromkeys(names) if n not in self.done and self.can_replay(n)]
        path = getattr(self.dump, "path", None)
        if jobs > 1 and len(todo) > 1 and path is not None and getattr(
                self.dump, "format", "") == "opdiff":
            start = time.perf_counter()
            size = max(1, len(todo) // (jobs * 4))
            batches = [todo[i:i + size] for i in range(0, len(todo), size)]
            for batch in self._workers(str(path), jobs).map(_worker_judge, batches):
                self.done.update(batch)
            self.seconds += time.perf_counter() - start
        return {n: self.judge(n) for n in names}

    def _workers(self, path: str, jobs: int) -> Any:
        if self._pool is None or self._pool[1] != jobs:
            self.close()
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # the workers die with this process (`watch_parent`)
            init = (os.getpid(), f"{__name__}:_worker_init", path, self.policy, self.shortcut)
            pool = ProcessPoolExecutor(max_workers=jobs,
                                       mp_context=multiprocessing.get_context("spawn"),
                                       initializer=watch_parent, initargs=init)
            self._pool = (pool, jobs, weakref.finalize(self, pool.shutdown, cancel_futures=True))
        return self._pool[0]

    def close(self) -> None:
        """Stop the worker processes of `judge_many` and `prefetch`'s thread (after the record
        it has in hand; the verdicts stay cached)."""
        if self._ahead is not None:
            with self._cond:
                self._stop = True
                self._queue = []
            self._ahead.join()
            self._ahead = None
        if self._pool is not None:
            pool, _, finalizer = self._pool
            finalizer.detach()
            pool.shutdown(cancel_futures=True)
            self._pool = None

    def summary(self) -> str:
        """One line: how many ops were replayed, in how long, and how many could not be."""
        order = {n: i for i, n in enumerate(self.records)}
        asked = sorted((n for n in self.done if n in self._asked),
                       key=lambda n: order.get(n, len(order)))
        ok = [self.done[n] for n in asked if self.done[n].replayed]
        skipped = [self.done[n] for n in asked if not self.done[n].replayed]
        ahead = sum(1 for n, v in self.done.items() if n not in self._asked and v.replayed)
        text = f"replayed {len(ok)} op(s) in float64 in {self.seconds:.2f} s"
        referenced = sum(1 for v in ok if any(t.reference_run for t in v.tensors))
        if self.shortcut and ok:
            text += f" ({referenced} needed the reference kernel)"
        if skipped:
            text += (f"; {len(skipped)} not replayed (e.g. {skipped[0].name}: "
                     f"{skipped[0].reason})")
        untrusted = [v.name for v in skipped if v.reason.startswith("untrusted:")]
        if untrusted:       # a dump is untrusted input: say which records replay refused to run
            text += (f"; {len(untrusted)} refused as untrusted (not pure tensor computations on "
                     f"the dump's tensors): {', '.join(untrusted[:5])}"
                     f"{' ...' if len(untrusted) > 5 else ''}")
        if ahead:
            text += f"; {ahead} more replayed ahead on a second thread and not needed"
        chained = [v for v in self.regions.values() if v.replayed]
        if self.regions:
            spent = sum(v.seconds for v in self.regions.values())
            text += f"; {len(chained)} region(s) replayed as chains in {spent:.2f} s"
        unchained = [v for v in self.regions.values() if not v.replayed]
        if unchained:
            text += (f", {len(unchained)} not (e.g. {unchained[0].name}: "
                     f"{unchained[0].reason})")
        return text


def replay_jobs() -> int:
    """How many processes the compare's replay uses: OPDIFF_REPLAY_JOBS, default 1. Worker
    processes pay off when many ops are replayed (a compare that finds nothing replays every op
    before it can say so) and cores are idle; each costs a Python+torch start (seconds)."""
    text = os.environ.get("OPDIFF_REPLAY_JOBS", "").strip()
    if not text:
        return 1
    try:
        return max(1, int(text))
    except ValueError:
        from ...errors import ConfigError
        raise ConfigError(f"OPDIFF_REPLAY_JOBS must be a whole number, not {text!r}") from None


def replay_threads() -> int:
    """Threads the compare's replay may use in one process (`Replayer.prefetch`):
    OPDIFF_REPLAY_THREADS, default 2 where this process may run on two cores or more and one of
    them is idle now, else 1. (On a machine whose cores other work keeps busy, a second thread
    measured slower, not faster: each of the measuring's many short kernels takes the GIL back,
    and waits whenever the thread holding it is descheduled.)"""
    text = os.environ.get("OPDIFF_REPLAY_THREADS", "").strip()
    if not text:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return 2 if cores >= 2 and _idle_core(cores) else 1
    try:
        return max(1, int(text))
    except ValueError:
        from ...errors import ConfigError
        raise ConfigError(f"OPDIFF_REPLAY_THREADS must be a whole number, not {text!r}") from None


def _idle_core(cores: int, samples: int = 5) -> bool:
    """Is a core free for a second thread: do at most `cores` - 1 tasks run, this one included
    (Linux's /proc/loadavg, the median of a few samples 5 ms apart)? True where it cannot tell."""
    seen = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                seen.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return True
        if i + 1 < samples:
            time.sleep(0.005)
    return sorted(seen)[len(seen) // 2] <= cores - 1


_WORKER: Optional[Replayer] = None


def _worker_init(path: str, policy: "Policy", shortcut: bool = True) -> None:
    global _WORKER
    import torch

    from ...store.reader import open_dump
    torch.set_num_threads(1)        # the workers share the cores
    _WORKER = Replayer(open_dump(path), policy=policy, shortcut=shortcut)


def _worker_judge(names: list[str]) -> dict[str, LocalError]:
    assert _WORKER is not None
    return {n: _WORKER.judge(n) for n in names}


__all__ = ["Replayer", "replay_jobs", "replay_threads", "LocalError", "TensorLocalError",
           "ChainError", "replay_region",
           "NotReplayable", "replay_record", "rebuild_call", "resolve"]
