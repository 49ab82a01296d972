"""L2 and mix under Inductor: each call of a kernel Inductor generated, recorded with its input
and output tensors.

Inductor's generated kernels run without a dispatch, so the L2 dispatch mode sees only the
extern kernels its wrapper calls (mm, addmm, bmm). This layer records the others, in four parts:

- kernel sources, one per backend, find the kernels and the seam each call passes:
  `kernel_cpp.CppSource` (C++ kernels, CPU: the wrapper's globals) and
  `kernel_triton.TritonSource` (Triton kernels, GPU: Inductor's launcher; not run on a GPU yet,
  so only with OPDIFF_TRITON_KERNELS=1 until it has been);
- `kernel_catalog.KernelCatalog` holds what opdiff learns of a kernel, whatever its backend
  (`KernelInfo`: name, argument roles, program, modules and source line per call);
- `kernel_recorder.KernelRecorder` records a call from its `KernelInfo`, backend-blind;
- the code generators' watches, `kernel_programs.ProgramWatch` (each kernel's fused aten ops)
  and `kernel_modules.ModuleWatch` (the modules of each wrapper call line), collect while
  Inductor generates a wrapper in this process; this layer hands what they found to the
  catalog when the wrapper is loaded (`PyCodeCache.load_by_key_path`).

A kernel record is `Inductor.<kernel>.<n>.<phase>` of kind `kernel` (`kernel_recorder.py`).
Nothing that Inductor generates or compiles changes, and a kernel's arguments are only read,
so the compiled step stays bitwise the same.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from .imports import Waiting, after_import
from .kernel_catalog import KernelCatalog
from .kernel_cpp import CppSource, kernels_of
from .kernel_modules import ModuleWatch
from .kernel_programs import ProgramWatch
from .kernel_recorder import KERNEL_PREFIX, KernelRecorder, from_parameters
from .kernel_triton import TritonSource

# Triton kernels are recorded only where this is "1": their source has not run on a GPU yet
# (kernel_triton.py); without it a compiled CUDA step's compare says they are not recorded.
TRITON_ENV = "OPDIFF_TRITON_KERNELS"


class InductorKernels:
    """The L2 layer that records Inductor's CPU kernels (see the module docstring)."""

    def __init__(self, session):
        self.session = session
        self.catalog = KernelCatalog()
        recorder = KernelRecorder(session)
        self.sources: tuple[Any, ...] = (CppSource(self.catalog, recorder),)
        if os.environ.get(TRITON_ENV) == "1":
            self.sources += (TritonSource(self.catalog, recorder),)
        self._watch = ProgramWatch()
        self._modules = ModuleWatch()
        self._load: Any = None
        self._waiting: Optional[Waiting] = None
        self._caches: list[tuple[Any, str, Any]] = []     # (config module, flag, its value)

    def start(self, model=None) -> None:
        # Inductor's code cache costs a second to import and a run that never compiles has no
        # kernels: hook into it when the program imports it (`torch.compile(...)` does),
        # which may be inside this window (capture/imports.py)
        # (only a tensor dump can replay them; at mix they say which outputs are computed from
        # parameters alone: autocast's weight casts, `from_parameters`)
        if self.session.config.task == "tensor" or self.session.config.level == "mix":
            self._watch.start()
        self._modules.start()
        for source in self.sources:
            source.start()
        self._waiting = after_import("torch._inductor.codecache", self._hook)

    def _hook(self, codecache: Any) -> None:
        """Wrap the kernels of every wrapper module loaded so far, and of each one loaded
        from now on (through `PyCodeCache.load_by_key_path`); and turn Inductor's caches off
        while this layer records (`_fresh`)."""
        self._fresh()
        PyCodeCache = codecache.PyCodeCache
        for mod in list(PyCodeCache.modules):
            self._loaded(mod)
        original = PyCodeCache.__dict__["load_by_key_path"]
        layer = self

        def load_by_key_path(cls, *args, **kwargs):
            programs = layer._watch.take()     # (made while this graph was generated)
            mod = original.__func__(cls, *args, **kwargs)
            path = getattr(mod, "__file__", None)
            if programs and path:
                layer.catalog.generated(path, programs)
            if path:
                layer._modules.loaded(path)
            layer._loaded(mod)
            return mod
        self._load = original
        PyCodeCache.load_by_key_path = classmethod(load_by_key_path)

    def _fresh(self) -> None:
        """Turn off Inductor's FX graph cache and AOTAutograd's cache while this layer records:
        a graph compiled now is generated here, with its modules and programs noted, never
        handed back from a compile made without opdiff (a user's earlier run of the same
        script), whose kernels name no module. What Inductor generates is the same either way
        (the cache only skips generating it), and its C++ kernels stay in their own cache;
        nothing is written to the caches meanwhile. Put back by `stop`."""
        from torch._functorch import config as aot_config
        from torch._inductor import config
        for module, flag in ((config, "fx_graph_cache"), (aot_config, "enable_autograd_cache")):
            self._caches.append((module, flag, getattr(module, flag)))
            setattr(module, flag, False)

    def stop(self) -> None:
        for module, flag, value in reversed(self._caches):
            setattr(module, flag, value)
        self._caches.clear()
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        if self._load is not None:
            PyCodeCache = sys.modules["torch._inductor.codecache"].PyCodeCache
            PyCodeCache.load_by_key_path = self._load
            self._load = None
        self._modules.stop()    # (before the programs' watch: both may wrap Inductor's codegen)
        self._watch.stop()
        for source in self.sources:
            source.stop()
        # (the catalog's programs stay: a wrapper loaded in this step runs again in later ones)

    def end_step(self) -> None:
        pass

    def _loaded(self, mod: Any) -> None:
        """A wrapper module was loaded: each source finds its kernels in it."""
        for source in self.sources:
            source.loaded(mod)


__all__ = ["InductorKernels", "KERNEL_PREFIX", "TRITON_ENV", "kernels_of", "from_parameters"]

