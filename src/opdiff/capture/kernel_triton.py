"""Inductor's Triton kernels (GPU) as a kernel source, through Inductor's launcher.

UNTESTED ON A GPU: written against torch 2.13's `triton_heuristics.CachingAutotuner` without a
GPU to run it on, so it records only where OPDIFF_TRITON_KERNELS=1 (`inductor.TRITON_ENV`).
On CPU, `tests/capture/test_kernel_sources.py` runs what it can: the seam patched and put back
on this torch's real launcher class, and a launch recorded through a CPU stand-in of it;
`tests/cuda/test_cuda_triton_capture.py` runs it end to end where CUDA is present.

Every Triton kernel of a wrapper is called through its launcher,
`triton_poi_fused_add_0.run(buf0, arg1_1, xnumel, stream=stream0)`: a `CachingAutotuner`
(`torch/_inductor/runtime/triton_heuristics.py`) whose `run` is the one seam all of them pass,
the one Inductor itself reports kernels to a debug mode from. While the source runs,
`CachingAutotuner.run` is replaced by a recorder of the call (`kernel_recorder.KernelCalls`);
the kernel's parameters are its Triton signature's (`triton_meta["signature"]`, in order,
named like the C++ kernels' `in_ptr0`, `out_ptr0`, `in_out_ptr0`, `xnumel`), its wrapper is
the file of the frame calling `run`, and the modules of each call line come from
`kernel_modules.ModuleWatch` (which also watches `TritonScheduling.define_kernel`). Autotuning
runs (`benchmark_run=True`) are not recorded. Its programs are not collected yet: a Triton
kernel's record says `{"unmapped": ...}` in a tensor dump, and `opdiff check` says so.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from .imports import Waiting, after_import
from .kernel_catalog import KernelCatalog, KernelInfo
from .kernel_recorder import KernelCalls, KernelRecorder

LAUNCHER = "torch._inductor.runtime.triton_heuristics"
NO_PROGRAM = "the programs of Triton kernels are not collected yet"


def launcher_params(autotuner: Any) -> list[str]:
    """A Triton launcher's kernel parameters, in signature order (constexpr ones included, as
    `run` takes its arguments)."""
    signature = (getattr(autotuner, "triton_meta", None) or {}).get("signature") or {}
    return [str(name) for name in signature]


def launcher_name(autotuner: Any) -> str:
    """The kernel's name as Inductor's wrapper calls it (`triton_poi_fused_add_0`)."""
    meta = getattr(autotuner, "inductor_meta", None) or {}
    name = meta.get("kernel_name")
    if not name:
        name = getattr(getattr(autotuner, "fn", None), "__name__", None) or "triton_"
    return str(name)


class TritonSource:
    """The Triton kernels launched while it runs (see the module docstring)."""

    backend = "triton"

    def __init__(self, catalog: KernelCatalog, recorder: KernelRecorder):
        self.catalog, self.recorder = catalog, recorder
        # (id of the launcher, its wrapper file) -> (the launcher, held so that its id is not
        # reused; its calls)
        self._calls: dict[tuple[int, str], tuple[Any, KernelCalls]] = {}
        self._owner: Any = None
        self._original: Optional[Callable[..., Any]] = None
        self._waiting: Optional[Waiting] = None

    def start(self) -> None:
        # (imported by the first compile for a GPU, maybe after this; never by capture)
        self._waiting = after_import(LAUNCHER, self.hook)

    def loaded(self, mod: Any) -> None:
        pass        # (its seam is the launcher class, patched once)

    def info(self, autotuner: Any, wrapper: str) -> KernelInfo:
        return self.catalog.info(launcher_name(autotuner), self.backend, wrapper,
                                 launcher_params(autotuner), {"unmapped": NO_PROGRAM})

    def calls(self, autotuner: Any, wrapper: str) -> KernelCalls:
        key = (id(autotuner), wrapper)
        found = self._calls.get(key)
        if found is None or found[0] is not autotuner:
            found = self._calls[key] = (autotuner, self.recorder.prepare(self.info(autotuner, wrapper)))
        return found[1]

    def hook(self, heuristics: Any) -> None:
        """Record the launches of `heuristics.CachingAutotuner` (Inductor's launcher module, or
        a stand-in of it) until `stop`."""
        owner: Any = getattr(heuristics, "CachingAutotuner", None)
        original = owner.__dict__.get("run") if owner is not None else None
        if original is None:        # another torch: its Triton kernels stay unrecorded
            return
        source = self

        def run(autotuner: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("benchmark_run"):
                return original(autotuner, *args, **kwargs)
            caller = sys._getframe(1)
            calls = source.calls(autotuner, caller.f_code.co_filename)
            return calls.call(caller.f_lineno, args, lambda: original(autotuner, *args, **kwargs))
        self._owner, self._original = owner, original
        owner.run = run

    def stop(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        if self._original is not None:
            self._owner.run = self._original
            self._owner = self._original = None
        self._calls.clear()


__all__ = ["TritonSource", "launcher_params", "launcher_name", "NO_PROGRAM"]
