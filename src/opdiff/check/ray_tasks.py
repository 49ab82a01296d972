"""`opdiff check DUMP --engine ray [--ray-address ADDR]`: the op replays as Ray tasks.

    from opdiff.check import check_dump
    result = check_dump("./dump/npu/step0/rank0", engine="ray", ray_address="auto")

The ops to check are cut into the same small batches as `--jobs` uses; each batch is one Ray
task that opens the dump by its path (a shared file system, or the disk of the node it runs
on; a Ray worker keeps the opened dump for its next batch) and returns its verdicts. The
driver writes them to the progress file as they arrive (`--resume` works the same) and sorts
them into execution order, so the result is the local engine's, row for row.

A task whose worker dies is retried (`MAX_RETRIES`, as the compare's Ray engine does); when it
still fails, the check fails with one line naming the op batch, and no partial result is
returned. Ray is imported only when this engine is chosen (`pip install opdiff[ray]`); errors
are the compare engine's `EngineError` (an OpdiffError: the CLI prints it and exits 2).
"""
from __future__ import annotations

import re
import socket
from typing import Any, Callable, Optional

from ..comparison.ray_engine import MAX_RETRIES, EngineError
from ..errors import OpdiffError
from .engine import OpCheck

REACH_TIMEOUT_S = 5.0
_ADDRESS = re.compile(r"^(?:ray://)?(\[[^\]]+\]|[^:/\s]+):(\d+)$")

# One opened dump per Ray worker process, kept for the worker's next batches of the same dump.
_OPENED: dict[tuple[str, Optional[str]], Any] = {}


def check_batch(path: str, device: Optional[str], names: list[str]) -> list[dict[str, Any]]:
    """A Ray task: the verdicts (`OpCheck.to_dict`) on some records of the dump at `path`."""
    import torch

    from .runner import CheckJob
    torch.set_num_threads(1)            # one task per CPU Ray gives it
    job = _OPENED.get((path, device))
    if job is None:
        job = _OPENED.setdefault((path, device), CheckJob(path, device))
    return [job.check(n).to_dict() for n in names]


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise EngineError("--engine ray needs Ray: pip install opdiff[ray]") from exc
    return ray


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def reachable(address: Optional[str]) -> None:
    """Raise EngineError (one line) unless `address` is None, "auto" or a host:port (also
    ray://host:port) that accepts a connection within REACH_TIMEOUT_S: Ray itself waits for
    minutes on an address where nothing listens."""
    if address is None or address == "auto":
        return
    m = _ADDRESS.match(address.strip())
    if m is None:
        raise EngineError(f"--ray-address {address!r}: expected auto, HOST:PORT or "
                          "ray://HOST:PORT")
    host, port = m.group(1).strip("[]"), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise EngineError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} "
                          "(is `ray start --head` running there?)") from None


def check_on_ray(path: str, device: Optional[str], todo: list[str],
                 finish: Callable[[OpCheck], None], address: Optional[str] = None) -> None:
    """Check the records `todo` of one dump in Ray tasks, calling `finish` with each verdict as
    its batch arrives. address: a running cluster ("auto", "host:6379", "ray://host:10001");
    None starts a local one for this call (or uses the one this process already joined)."""
    from .runner import batches

    ray = _ray()
    started = False
    if not ray.is_initialized():
        reachable(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds for an unreachable head
            raise EngineError(f"cannot start or reach the Ray cluster at {address or 'local'}: "
                              f"{_line(exc)}") from None
        started = True
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(check_batch)
        parts = batches(todo, cpus)
        refs = [task.remote(path, device, part) for part in parts]
        where = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for d in _get(ray, done[0], parts[where[done[0]]]):
                finish(OpCheck.from_dict(d))
    finally:
        if started:
            ray.shutdown()


def _get(ray: Any, ref: Any, names: list[str]) -> list[dict[str, Any]]:
    what = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)} ops)"
    try:
        got: list[dict[str, Any]] = ray.get(ref)
        return got
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, OpdiffError):
            raise cause from None       # the dump's own error, as the local engine says it
        raise EngineError(f"checking {what} failed in its Ray task: {_line(cause)}") from None
    except ray.exceptions.RayError as exc:      # the worker died MAX_RETRIES + 1 times, node lost
        raise EngineError(f"checking {what} failed on the Ray cluster after {MAX_RETRIES} "
                          f"retries ({_line(exc)}); no partial result is written") from None


__all__ = ["check_on_ray", "check_batch"]
