"""Compare step/rank pairs as Ray tasks: `opdiff compare ... --engine ray [--ray-address ADDR]`.

    from opdiff.comparison.ray_engine import run_pairs_ray
    results = run_pairs_ray(pairs, Policy(), address="auto", pins={"/mnt/nodeA": "dumpA"})

Each task opens its two dumps by path (a shared file system, or the disk of the node it runs on)
and returns two objects: its pair's outcome without the rows (counts, first divergence, notes),
and its rows as spool bytes, which stay in the cluster's object store until the driver fetches
them one pair at a time and writes them to its spool (`spool.py`); the driver never holds more
than one pair's rows. The merge and the first-divergence analysis stay on
the driver (`runs.merge`), so the result is the local engine's, row for row. `pins` maps a path
prefix to a Ray custom resource: a pair whose target lies under the prefix runs only on a node
that offers that resource (`ray start --resources='{"dumpA": 1}'` on the node holding it).

A task whose worker dies is retried (`max_retries`); when it still fails, the compare fails with
one line naming the step and rank; a partial result is never returned. Ray is imported here
only when this engine is chosen (`pip install opdiff[ray]`).
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable, Mapping, Optional

from ..errors import OpdiffError
from .result import CompareResult
from .runs import Pair, _worker, count_records, unspooled
from .spool import Spool, SpoolFile
from .verdicts import Policy

MAX_RETRIES = 3
# A task's share of a pinned resource: many pairs of one node's dumps may run there at once.
PIN_SHARE = 0.001


class EngineError(OpdiffError):
    """The Ray engine is missing, cannot reach its cluster, or a task failed for good."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise EngineError("--engine ray needs Ray: pip install opdiff[ray]") from exc
    return ray


PROBE_S = 5.0


def _probe(address: Optional[str]) -> None:
    """An EngineError when `address` names a host:port where nothing listens (`ray.init` would
    retry its GCS for minutes there). "auto", None and addresses without a port are Ray's."""
    if not address or address == "auto":
        return
    where = address.split("://", 1)[-1]
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), PROBE_S).close()
    except OSError as exc:
        raise EngineError(f"cannot reach the Ray cluster at {address}: nothing answers there "
                          f"({exc.strerror or type(exc).__name__}); start it with `ray start "
                          f"--head` or pass the address `ray status` shows") from None


def _pin(path: str, pins: Mapping[str, str]) -> Optional[str]:
    """The custom resource of the longest pinned prefix `path` lies under, or None."""
    real = os.path.realpath(path)
    best: Optional[tuple[int, str]] = None
    for prefix, resource in pins.items():
        root = os.path.realpath(prefix)
        if (real == root or real.startswith(root.rstrip(os.sep) + os.sep)) and \
                (best is None or len(root) > best[0]):
            best = (len(root), resource)
    return best[1] if best else None


def run_pairs_ray(pairs: list[Pair], policy: Policy, *, shape_flag: bool = False,
                  replay: str = "auto", replay_jobs: Optional[int] = None,
                  address: Optional[str] = None,
                  pins: Optional[Mapping[str, str]] = None,
                  tick: Optional[Callable[[int], None]] = None,
                  on_pair: Optional[Callable[[Pair], None]] = None) -> list[CompareResult]:
    """Every (target, golden) pair compared in a Ray task; results in the order of `pairs`.

    address: a running cluster ("auto", "ray://host:10001", "host:6379"); None starts a local
    one for this call (or uses the one this process already joined).
    tick, on_pair, replay_jobs: as for `runs.run_pairs`.
    """
    ray = _ray()
    advance: Callable[[int], None] = tick or (lambda n: None)
    finished: Callable[[Pair], None] = on_pair or (lambda p: None)
    started = False
    if not ray.is_initialized():
        _probe(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds for an unreachable head
            raise EngineError(f"cannot start or reach the Ray cluster at {address or 'local'}: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                              ) from exc
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False,
                          num_returns=2)(_remote)
        refs = []
        for t, g in pairs:
            resource = _pin(str(t.path), pins or {})
            opts: dict[str, Any] = {"resources": {resource: PIN_SHARE}} if resource else {}
            refs.append(task.options(**opts).remote(str(t.path), str(g.path), policy.thresholds,
                                                    shape_flag, replay, replay_jobs))
        where = {outcome: i for i, (outcome, _rows) in enumerate(refs)}
        spool = Spool()
        results: list[Optional[CompareResult]] = [None] * len(refs)
        pending = [outcome for outcome, _rows in refs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            i = where[done[0]]
            compact, meta = _get(ray, done[0], pairs[i])
            blob: bytes = _get(ray, refs[i][1], pairs[i])
            path = spool.write_blob(i, blob)
            del blob
            refs[i] = (None, None)        # the cluster may free the rows now
            results[i] = unspooled(compact, spool, SpoolFile(path, meta.count, meta.offsets,
                                                             meta.step, meta.rank))
            advance(count_records(pairs[i][0]))
            finished(pairs[i])
        return [r for r in results if r is not None]
    finally:
        if started:
            ray.shutdown()


def _remote(target_path: str, golden_path: str, thresholds: Any, shape_flag: bool,
            replay: str, replay_jobs: Optional[int] = None
            ) -> tuple[tuple[CompareResult, SpoolFile], bytes]:
    """A Ray task: (the pair's outcome without rows, where they lie), the spool bytes."""
    compact, meta, blob = _worker(target_path, golden_path, thresholds, shape_flag, replay, None,
                                  replay_jobs)
    return (compact, meta), blob or b""


def _get(ray: Any, ref: Any, pair: Pair) -> Any:
    t = pair[0]
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, OpdiffError):
            raise cause from None     # the dump's own error, as the local engine says it
        raise EngineError(f"comparing step {t.step} rank {t.rank} failed in its Ray task: "
                          f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
                          ) from None
    except ray.exceptions.RayError as exc:   # the worker died MAX_RETRIES + 1 times, node lost...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EngineError(f"comparing step {t.step} rank {t.rank} failed on the Ray cluster after "
                          f"{MAX_RETRIES} retries ({type(exc).__name__}: {first}); no partial "
                          f"result is written") from None


__all__ = ["run_pairs_ray", "EngineError", "MAX_RETRIES"]
