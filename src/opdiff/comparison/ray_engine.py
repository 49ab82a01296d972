"""Compare step/rank pairs as Ray tasks: `opdiff compare ... --engine ray [--ray-address ADDR]`.

    from opdiff.comparison.ray_engine import run_pairs_ray
    results = run_pairs_ray(pairs, CompareOptions(), address="auto", pins={"/mnt/nodeA": "dumpA"})

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

import contextlib
import os
import re
import socket
from typing import Any, Callable, Iterator, Mapping, Optional

from ..errors import OpdiffError
from .options import CompareOptions
from .result import CompareResult
from .runs import Pair, _worker, count_records, unspooled
from .shards import Scores, measure_shard, merged, plan
from .spool import Spool, SpoolFile

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


REACH_TIMEOUT_S = 5.0
_ADDRESS = re.compile(r"^(?:ray://)?(\[[^\]]+\]|[^:/\s]+):(\d+)$")


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`: how a Ray failure is quoted in an EngineError."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def host_port(address: object) -> Optional[tuple[str, int]]:
    """(host, port) of a Ray address given as HOST:PORT or ray://HOST:PORT; None for None and
    "auto" (Ray's own: a local cluster, the running one); EngineError (one line) for anything
    else. Connects to nothing (`reachable` does)."""
    if address is None or address == "auto":
        return None
    m = _ADDRESS.match(address.strip()) if isinstance(address, str) else None
    if m is None:
        raise EngineError(f"Ray address {address!r}: expected auto, HOST:PORT or "
                          "ray://HOST:PORT")
    return m.group(1).strip("[]"), int(m.group(2))


def reachable(address: Optional[str]) -> None:
    """Raise EngineError (one line) unless `address` is None, "auto" or a host:port (also
    ray://host:port) that accepts a connection within REACH_TIMEOUT_S: Ray itself retries its
    GCS for minutes on an address where nothing listens."""
    where = host_port(address)
    if where is None:
        return
    host, port = where
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise EngineError(f"cannot reach the Ray cluster at {address}: nothing answers there "
                          f"({exc.strerror or type(exc).__name__}); start it with `ray start "
                          f"--head` or pass the address `ray status` shows") from None


@contextlib.contextmanager
def joined(address: Optional[str]) -> Iterator[Any]:
    """Ray, joined to the cluster at `address` ("auto", "host:6379", "ray://host:10001"; None
    starts a local one), or to the one this process joined already; a cluster joined here is
    left on exit. Used by compare's and check's Ray engines."""
    ray = _ray()
    started = False
    if not ray.is_initialized():
        reachable(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds for an unreachable head
            raise EngineError(f"cannot start or reach the Ray cluster at {address or 'local'}: "
                              f"{one_line(exc)}") from None
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def fetched(ray: Any, ref: Any, what: str) -> Any:
    """`ray.get(ref)`, with a task's failure as one line: the dump's own OpdiffError as the
    local engine raises it, else an EngineError saying `what` failed (after MAX_RETRIES for a
    worker or node lost). Never a partial result."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, OpdiffError):
            raise cause from None     # the dump's own error, as the local engine says it
        raise EngineError(f"{what} failed in its Ray task: {one_line(cause)}") from None
    except ray.exceptions.RayError as exc:   # the worker died MAX_RETRIES + 1 times, node lost...
        raise EngineError(f"{what} failed on the Ray cluster after {MAX_RETRIES} retries "
                          f"({one_line(exc)}); no partial result is written") from None


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


def run_pairs_ray(pairs: list[Pair], options: CompareOptions, *,
                  address: Optional[str] = None,
                  pins: Optional[Mapping[str, str]] = None,
                  tick: Optional[Callable[[int], None]] = None,
                  on_pair: Optional[Callable[[Pair], None]] = None,
                  shard_bytes: Optional[int] = None) -> list[CompareResult]:
    """Every (target, golden) pair compared in a Ray task; results in the order of `pairs`.

    address: a running cluster ("auto", "ray://host:10001", "host:6379"); None starts a local
    one for this call (or uses the one this process already joined).
    shard_bytes: a pair whose saved tensors hold more is measured in shards of about this many
    bytes, each its own task (`shards.py`), before its pair task aligns, judges and blames;
    None: one task per pair.
    options, tick, on_pair: as for `runs.run_pairs` (the options travel to every pair task, the
    mapping with them; shards are planned without it, so `RayEngine` refuses the two together).
    """
    advance: Callable[[int], None] = tick or (lambda n: None)
    finished: Callable[[Pair], None] = on_pair or (lambda p: None)
    with joined(address) as ray:
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False,
                          num_returns=2)(_remote)
        opts = [_options(str(t.path), pins or {}) for t, _g in pairs]
        plans = _plans(ray, pairs, opts, shard_bytes, options.shape_flag)
        portable = options.portable()
        measure = ray.remote(num_cpus=1, max_retries=MAX_RETRIES,
                             retry_exceptions=False)(measure_shard)
        refs = []
        for i, (t, g) in enumerate(pairs):
            groups = _get(ray, plans[i], pairs[i]) if plans else []
            # the shards' scores go straight to the pair task (Ray passes them), not through here
            parts = [measure.options(**opts[i]).remote(str(t.path), str(g.path), group)
                     for group in groups]
            refs.append(task.options(**opts[i]).remote(str(t.path), str(g.path), portable,
                                                       *parts))
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


def _options(path: str, pins: Mapping[str, str]) -> dict[str, Any]:
    """A pair's task options: on the node offering its pin's resource, if it has one."""
    resource = _pin(path, pins)
    return {"resources": {resource: PIN_SHARE}} if resource else {}


def _plans(ray: Any, pairs: list[Pair], opts: list[dict[str, Any]], shard_bytes: Optional[int],
           shape_flag: bool) -> list[Any]:
    """Each pair's shard plan, as a task beside its dumps (refs); [] when not sharding."""
    if not shard_bytes:
        return []
    planner = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(plan)
    return [planner.options(**o).remote(str(t.path), str(g.path), shard_bytes, shape_flag)
            for (t, g), o in zip(pairs, opts)]


def _remote(target_path: str, golden_path: str, options: CompareOptions, *parts: Scores
            ) -> tuple[tuple[CompareResult, SpoolFile], bytes]:
    """A Ray task: (the pair's outcome without rows, where they lie), the spool bytes. `parts`:
    its shards' scores (Ray hands the shard tasks' results over once they are done); options:
    as the local engine applies them to this pair (the mapping file among them)."""
    compact, meta, blob = _worker(target_path, golden_path, options, None,
                                  merged(parts) if parts else None)
    return (compact, meta), blob or b""


def _get(ray: Any, ref: Any, pair: Pair) -> Any:
    return fetched(ray, ref, f"comparing step {pair[0].step} rank {pair[0].rank}")


__all__ = ["run_pairs_ray", "EngineError", "MAX_RETRIES", "joined", "host_port", "reachable",
           "fetched", "one_line"]
