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
returned. Joining the cluster, the address check and the task errors are the compare engine's
(`comparison.ray_engine.joined`, `fetched`: one `EngineError` line, which the CLI prints with
exit 2). Ray is imported only when this engine is chosen (`pip install opdiff[ray]`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..comparison.ray_engine import MAX_RETRIES, fetched, joined
from ..store.limits import max_tensor_mb
from .engine import OpCheck

# One opened dump per Ray worker process, kept for the worker's next batches of the same dump.
_OPENED: dict[tuple[str, Optional[str]], Any] = {}


def check_batch(path: str, device: Optional[str], names: list[str],
                max_tensor_mb: Optional[int] = None) -> list[dict[str, Any]]:
    """A Ray task: the verdicts (`OpCheck.to_dict`) on some records of the dump at `path`.
    max_tensor_mb: the driver's `--max-tensor-mb` (a Ray worker does not inherit its
    environment)."""
    import torch

    from ..store.limits import set_max_tensor_mb
    from .runner import CheckJob
    set_max_tensor_mb(max_tensor_mb)
    torch.set_num_threads(1)            # one task per CPU Ray gives it
    job = _OPENED.get((path, device))
    if job is None:
        job = _OPENED.setdefault((path, device), CheckJob(path, device))
    return [job.check(n).to_dict() for n in names]


def check_on_ray(path: str, device: Optional[str], todo: list[str],
                 finish: Callable[[OpCheck], None], address: Optional[str] = None) -> None:
    """Check the records `todo` of one dump in Ray tasks, calling `finish` with each verdict as
    its batch arrives. address: a running cluster ("auto", "host:6379", "ray://host:10001");
    None starts a local one for this call (or uses the one this process already joined)."""
    from .runner import batches

    with joined(address) as ray:
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(check_batch)
        parts = batches(todo, cpus)
        limit = max_tensor_mb()
        refs = [task.remote(path, device, part, limit) for part in parts]
        where = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for d in _get(ray, done[0], parts[where[done[0]]]):
                finish(OpCheck.from_dict(d))


def _get(ray: Any, ref: Any, names: list[str]) -> list[dict[str, Any]]:
    what = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)} ops)"
    got: list[dict[str, Any]] = fetched(ray, ref, f"checking {what}")
    return got


__all__ = ["check_on_ray", "check_batch"]
