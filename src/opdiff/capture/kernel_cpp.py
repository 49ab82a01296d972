"""Inductor's C++ kernels (CPU) as a kernel source: where they are, and the seam they are called through.

The wrapper Inductor generates is a Python module loaded through `PyCodeCache`; each C++ kernel
in it is a module global made by

    cpp_fused_mul_silu_0 = async_compile.cpp_pybinding(['const float*', 'const float*', 'float*'],
        r'''extern "C" void kernel(const float* in_ptr0, const float* in_ptr1, float* out_ptr0) ...''')

and called by name from the wrapper's `call`: `cpp_fused_mul_silu_0(buf0, buf1, buf2)`. When a
wrapper is loaded (`loaded`), those globals are replaced by a recorder of each call
(`kernel_recorder.KernelCalls`) that knows the kernel's parameters from its C++ signature; `stop`
puts the originals back. Nothing that Inductor generates or compiles changes.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Callable, Optional

from .kernel_catalog import KernelCatalog, role
from .kernel_recorder import KernelCalls, KernelRecorder

_BINDING = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\(\[[^\]]*\],\s*r'''(.*?)'''",
                      re.M | re.S)
_SIGNATURE = re.compile(r'extern\s+"C"\s+\w*\s*void\s+kernel\(([^)]*)\)')
_PARAM = re.compile(r"(\w+)\s*$")


def _params(source: str) -> Optional[list[str]]:
    """The kernel's parameter names, in signature order ("" where none is found)."""
    m = _SIGNATURE.search(source)
    if m is None:
        return None
    return [(name.group(1) if (name := _PARAM.search(p.strip())) else "")
            for p in m.group(1).split(",")]


def kernel_params(path: str) -> dict[str, list[str]]:
    """The C++ kernels a generated wrapper defines, with their parameters' names."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for name, source in _BINDING.findall(text):
        params = _params(source)
        if params is not None:
            out[name] = params
    return out


def kernels_of(path: str) -> dict[str, list[str]]:
    """The C++ kernels a generated wrapper defines, with their parameters' roles."""
    return {name: [role(p) for p in params] for name, params in kernel_params(path).items()}


class CppSource:
    """The C++ kernels of each wrapper loaded while it runs (see the module docstring)."""

    backend = "cpp"

    def __init__(self, catalog: KernelCatalog, recorder: KernelRecorder):
        self.catalog, self.recorder = catalog, recorder
        self._wrapped: list[tuple[Any, str, Callable[..., Any]]] = []   # (module, name, original)
        self._seen: set[int] = set()      # ids of the wrapper modules wrapped (held in _wrapped)
        self._kernels: dict[str, dict[str, list[str]]] = {}   # wrapper file -> its kernels

    def start(self) -> None:
        pass        # (its seam is the wrapper's globals, replaced as each wrapper is loaded)

    def loaded(self, mod: Any) -> None:
        path = getattr(mod, "__file__", None)
        # (a cache hit loads the same file again as another module object)
        if not path or id(mod) in self._seen:
            return
        self._seen.add(id(mod))
        if path not in self._kernels:
            self._kernels[path] = kernel_params(path)
        for name, params in self._kernels[path].items():
            fn = getattr(mod, name, None)
            if fn is None or not callable(fn):
                continue
            self._wrapped.append((mod, name, fn))
            calls = self.recorder.prepare(self.catalog.info(name, self.backend, path, params))
            setattr(mod, name, _recording(calls, fn))

    def stop(self) -> None:
        for mod, name, fn in self._wrapped:
            setattr(mod, name, fn)
        self._wrapped.clear()
        self._seen.clear()


def _recording(calls: KernelCalls, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The kernel's stand-in in its wrapper: called from the wrapper's line."""
    def record_kernel(*args: Any) -> Any:
        return calls.call(sys._getframe(1).f_lineno, args, lambda: fn(*args))
    return record_kernel


__all__ = ["CppSource", "kernel_params", "kernels_of"]
