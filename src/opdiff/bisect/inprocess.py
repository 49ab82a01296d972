"""`opdiff.compile_bisect(step)`: which compiler stage makes one step differ from eager,
with the step run in this process.

    def step():
        torch.manual_seed(0)
        model = build_model()
        compiled = torch.compile(model)          # inside: each run compiles anew
        loss = compiled(x).square().mean()
        loss.backward()
        return [loss] + [p.grad for p in model.parameters()]

    result = opdiff.compile_bisect(step)
    print("\\n".join(result.lines()))

`step` takes no arguments, calls `torch.compile` itself (the bisector picks the backend when
torch.compile is called, so a model compiled before the bisect keeps its backend: refused), and
returns what to judge: tensors, or lists, tuples and dicts of them. It runs twice with
torch.compile disabled (the golden, and a check that the step is deterministic), then once per
bisector run; `torch._dynamo.reset()` comes before each run.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Callable, Iterator, Optional

import torch

from ..comparison.verdicts import Policy
from ..errors import OpdiffError
from .judge import RunVerdict, judge, named_tensors
from .stages import StageResult, StepFailed, drive

BISECT_ENV = ("TORCH_BISECT_BACKEND", "TORCH_BISECT_SUBSYSTEM", "TORCH_BISECT_MAX")


class BisectInputError(OpdiffError):
    """A step or command compile-bisect cannot work with (fails in eager, not deterministic,
    compiles nothing, or compiles before the bisect)."""


def refuse_bisect_environment() -> None:
    """torch reads TORCH_BISECT_* once per process: set by the user, they would fix every run."""
    found = [k for k in BISECT_ENV if os.environ.get(k)]
    if found:
        raise BisectInputError(f"{', '.join(found)} is set: unset it, compile-bisect sets the "
                               f"bisector's settings itself")


def golden_of(results: list[dict[str, torch.Tensor]], policy: Policy,
              what: str) -> dict[str, torch.Tensor]:
    """The golden from two eager runs, refused when they disagree or hold no tensor."""
    first, second = results
    if not first:
        raise BisectInputError(f"{what} returned no tensor to judge (return the loss and the "
                               f"gradients, or the outputs)")
    again = judge(second, first, policy)
    if not again.agrees:
        raise BisectInputError(f"not reproducible: two eager runs of {what} differ ({again.reason}); "
                               f"seed it (opdiff.seed_all) and make it deterministic first")
    return first


@contextlib.contextmanager
def _bisect_environment(env: dict[str, str]) -> Iterator[None]:
    """This process compiling as a fresh one would with `env` (torch caches what it read)."""
    from torch._inductor import compiler_bisector as cb

    saved = {k: os.environ.get(k) for k in BISECT_ENV}
    enabled = cb.CompilerBisector.bisection_enabled
    os.environ.update(env)
    cb.get_env_val.cache_clear()
    cb.subsystem_call_counter.clear()       # a fresh process counts applications from 0
    cb.CompilerBisector.bisection_enabled = True
    # torch also reads config changes from its state directory: an empty one of ours, not the
    # bisect_status a manual bisect may have left in the user's Inductor cache
    empty = tempfile.mkdtemp(prefix="opdiff-bisect-")
    cb.CompilerBisector.in_process_cache = empty
    try:
        yield
    finally:
        cb.CompilerBisector.in_process_cache = None
        shutil.rmtree(empty, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        cb.get_env_val.cache_clear()
        cb.CompilerBisector.bisection_enabled = enabled


def compile_bisect(step: Callable[[], Any], *, thresholds: Any = None,
                   progress: Optional[Callable[[str], None]] = None) -> StageResult:
    """Which compiler stage makes `step` differ from eager (see the module docstring).

    thresholds: as `opdiff.compare`'s (None: each dtype's defaults). progress: called with one
    line per run (default: opdiff's log). Raises `BisectInputError` on a step that fails in
    eager, is not deterministic or does not compile inside itself.
    """
    import torch._dynamo
    from torch._dynamo.utils import counters

    refuse_bisect_environment()
    policy = Policy(thresholds)

    def eager() -> dict[str, torch.Tensor]:
        torch._dynamo.reset()
        try:
            with torch._dynamo.config.patch(disable=True):
                return named_tensors(step())
        except Exception as exc:  # noqa: BLE001 - the user's step: its failure is bad input
            raise BisectInputError(f"the step fails in eager: {type(exc).__name__}: {exc}") from None

    golden = golden_of([eager(), eager()], policy, "the step")
    first = [True]

    def run_once() -> RunVerdict:
        from torch._inductor.compiler_bisector import CompilerBisector

        torch._dynamo.reset()
        counters.clear()
        backend = CompilerBisector.get_backend()
        try:
            out = named_tensors(step())
        except Exception as exc:  # noqa: BLE001 - a compiler failure is not a numerical verdict
            raise StepFailed(f"the step raised under backend {backend}: {type(exc).__name__}: "
                             f"{exc}") from None
        finally:
            torch._dynamo.reset()
        if first[0]:
            first[0] = False
            if not counters["frames"]["ok"]:
                raise BisectInputError("the step compiled nothing: call torch.compile inside it")
            if backend == "eager" and counters["aot_autograd"]["total"]:
                raise BisectInputError("the step ran a model compiled before the bisect (its "
                                       "backend is fixed): call torch.compile inside the step")
        return judge(out, golden, policy)

    def confirm(env: dict[str, str]) -> RunVerdict:
        with _bisect_environment(env):
            return run_once()

    return drive(run_once, confirm=confirm, progress=progress)


__all__ = ["compile_bisect", "BisectInputError", "golden_of", "refuse_bisect_environment"]
