"""What opdiff learns about a kernel Inductor generated, in one place, whatever its backend.

A kernel source (`kernel_cpp.CppSource` for Inductor's C++ kernels, `kernel_triton.TritonSource`
for its Triton ones) finds each kernel and how it is called; what it learns is one
`KernelInfo`:

- its name (`cpp_fused_mul_silu_0`, `triton_poi_fused_add_0`: it lists the ops it fuses) and
  the wrapper file that calls it;
- its arguments' roles, from their names, which both backends spell alike (`in_ptr0`,
  `out_ptr1`, `in_out_ptr0`; anything else, a size such as `xnumel`, is no tensor of its own);
- its program (`kernel_programs.py`: its fused aten ops over its arguments, or
  `{"unmapped": why}`);
- per call line of its wrapper, the modules of the FX nodes that call computes
  (`kernel_modules.py`) and the user's source line (`source_at`).

`KernelCatalog` keeps what the code generators' watches hand over per wrapper (the programs of
the kernels generated while opdiff recorded) and makes each kernel's `KernelInfo`. The
recorder (`kernel_recorder.KernelRecorder`) reads only `KernelInfo`, never a backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..store.frames import is_internal
from .kernel_modules import modules_at
from .kernel_programs import Program, bind

IN, OUT, IN_OUT = "in", "out", "in_out"
NOT_GENERATED = ("Inductor did not generate it while opdiff recorded (a wrapper from its cache, "
                 "or compiled before capture started)")


def role(param: str) -> str:
    """A kernel parameter's role from its name: "in", "out" or "in_out" ("" for a scalar
    such as a dynamic size)."""
    return (IN_OUT if param.startswith("in_out_ptr") else IN if param.startswith("in_ptr")
            else OUT if param.startswith("out_ptr") else "")


@dataclass(frozen=True)
class KernelInfo:
    """One generated kernel, as every backend describes it (see the module docstring)."""
    name: str
    backend: str                # "cpp" or "triton"
    wrapper: str                # the file of the wrapper module that calls it
    params: tuple[str, ...]     # its parameters' names, in signature order
    program: Program            # bound to `params`; {"unmapped": why} where unknown

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(role(p) for p in self.params)

    def modules_at(self, line: int) -> Optional[list[str]]:
        """The modules of the FX nodes the call at this wrapper line computes (None: unknown)."""
        return modules_at(self.wrapper, line)

    def source_at(self, line: int) -> Optional[list[Any]]:
        """The user's line of the FX nodes the call at this wrapper line computes, innermost
        first and outside torch and opdiff ([file, line]), from the stack traces Inductor
        keeps per wrapper line; None where none is known."""
        try:
            from torch._inductor.codecache import PyCodeCache
            frames = PyCodeCache.stack_frames_for_code(self.wrapper, line) or []
        except Exception:
            frames = []
        # (not opdiff's own line, which a node traced under the API layer's mode lists too)
        user = next((f for f in frames if not is_internal(str(f.get("filename") or ""))), None)
        return None if user is None else [user.get("filename"), user.get("line")]


class KernelCatalog:
    """The programs the code generators' watches collected, per wrapper file, and the
    `KernelInfo` of each kernel a source finds."""

    def __init__(self) -> None:
        self._programs: dict[str, dict[str, Program]] = {}   # wrapper file -> kernel -> program

    def generated(self, wrapper: str, programs: dict[str, Program]) -> None:
        """The programs of the kernels of a wrapper generated in this process."""
        if programs:
            self._programs[wrapper] = programs

    def info(self, name: str, backend: str, wrapper: str, params: list[str] | tuple[str, ...],
             program: Optional[Program] = None) -> KernelInfo:
        """The kernel `name` of `wrapper` with these parameters; its program as collected
        (`program` where the source knows better: Triton's, not collected yet)."""
        if program is None:
            programs = self._programs.get(wrapper, {})
            program = bind(programs[name], list(params)) if name in programs else {
                "unmapped": NOT_GENERATED}
        return KernelInfo(name, backend, wrapper, tuple(params), program)

    def clear(self) -> None:
        self._programs.clear()


__all__ = ["IN", "OUT", "IN_OUT", "role", "KernelInfo", "KernelCatalog", "NOT_GENERATED"]
