"""L2 under Inductor: each generated CPU kernel call recorded with its input and output tensors.

Inductor's generated kernels run without a dispatch, so the L2 dispatch mode sees only the
extern kernels its wrapper calls (mm, addmm, bmm). The wrapper is a Python module that Inductor
loads through `PyCodeCache`; each C++ kernel in it is a module global made by

    cpp_fused_mul_silu_0 = async_compile.cpp_pybinding(['const float*', 'const float*', 'float*'],
        r'''extern "C" void kernel(const float* in_ptr0, const float* in_ptr1, float* out_ptr0) ...''')

and called by name from the wrapper's `call`: `cpp_fused_mul_silu_0(buf0, buf1, buf2)`. While
this layer runs, those globals are replaced by a recorder that describes the kernel's
`in_ptr`/`in_out_ptr` arguments before the call and its `out_ptr`/`in_out_ptr` arguments after
it (the kernel signature names which is which), and puts the originals back when it stops.
Nothing that Inductor generates or compiles changes, and a kernel's arguments are only read,
so the compiled step stays bitwise the same.

A kernel record is `Inductor.<kernel>.<n>.<phase>` of kind `kernel`, with the `compiled` field
the comparison reads: `{"graph": <wrapper file>, "node": <kernel>, "backend": "inductor",
"source": [file, line]}` (the kernel's name lists the ops it fuses); the user's line comes
from the FX node stack traces Inductor keeps for each line of its wrapper
(`PyCodeCache.stack_frames_for_code`); at mix, `from_parameters` lists the outputs the kernel
computes from parameters and buffers alone, with their names (autocast's weight casts, from
the kernel's program: `from_parameters`). Each kernel record of a tensor dump also carries
`program`, what the kernel computes as aten ops over its arguments (`kernel_programs.py`:
collected while Inductor generates the wrapper in this process, `{"unmapped": why}`
otherwise), which `opdiff check` replays. Triton kernels (GPU) are not recorded yet.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Callable, Optional

import torch

from ..store.frames import is_internal
from ..store.schema import INDUCTOR, Kind, Phase, Role, record_name
from .imports import Waiting, after_import
from .kernel_modules import ModuleWatch, modules_at
from .leaves import tag_leaves
from .kernel_programs import Program, ProgramWatch, bind, inputs_of_outputs, inputs_read

KERNEL_PREFIX = "Inductor"
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


def _role(param: str) -> str:
    """A kernel parameter's role from its C++ name: "in", "out" or "in_out" ("" for a scalar
    such as a dynamic size)."""
    return ("in_out" if param.startswith("in_out_ptr") else "in" if param.startswith("in_ptr")
            else "out" if param.startswith("out_ptr") else "")


def _roles(source: str) -> Optional[list[str]]:
    """Each kernel parameter's role (`_role`)."""
    params = _params(source)
    return None if params is None else [_role(p) for p in params]


def kernels_of(path: str) -> dict[str, list[str]]:
    """The C++ kernels a generated wrapper defines, with their parameters' roles."""
    return {name: [_role(p) for p in params] for name, params in _kernel_params(path).items()}


def _kernel_params(path: str) -> dict[str, list[str]]:
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


class InductorKernels:
    """The L2 layer that records Inductor's CPU kernels (see the module docstring)."""

    def __init__(self, session):
        self.session = session
        self._wrapped: list[tuple[Any, str, Callable[..., Any]]] = []   # (module, name, original)
        self._seen: set[int] = set()      # ids of the wrapper modules wrapped (held in _wrapped)
        self._kernels: dict[str, dict[str, list[str]]] = {}   # wrapper file -> its kernels
        self._programs: dict[str, dict[str, Program]] = {}    # wrapper file -> its programs
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
        self._waiting = after_import("torch._inductor.codecache", self._hook)

    def _hook(self, codecache: Any) -> None:
        """Wrap the kernels of every wrapper module loaded so far, and of each one loaded
        from now on (through `PyCodeCache.load_by_key_path`); and turn Inductor's caches off
        while this layer records (`_fresh`)."""
        self._fresh()
        PyCodeCache = codecache.PyCodeCache
        for mod in list(PyCodeCache.modules):
            self._wrap(mod)
        original = PyCodeCache.__dict__["load_by_key_path"]
        layer = self

        def load_by_key_path(cls, *args, **kwargs):
            programs = layer._watch.take()     # (made while this graph was generated)
            mod = original.__func__(cls, *args, **kwargs)
            path = getattr(mod, "__file__", None)
            if programs and path:
                layer._programs[path] = programs
            if path:
                layer._modules.loaded(path)
            layer._wrap(mod)
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
        for mod, name, fn in self._wrapped:
            setattr(mod, name, fn)
        self._wrapped.clear()
        self._seen.clear()

    def end_step(self) -> None:
        pass

    def _wrap(self, mod: Any) -> None:
        path = getattr(mod, "__file__", None)
        # (a cache hit loads the same file again as another module object)
        if not path or id(mod) in self._seen:
            return
        self._seen.add(id(mod))
        if path not in self._kernels:
            self._kernels[path] = _kernel_params(path)
        programs = self._programs.get(path, {})
        for name, params in self._kernels[path].items():
            fn = getattr(mod, name, None)
            if fn is None or not callable(fn):
                continue
            self._wrapped.append((mod, name, fn))
            program = bind(programs[name], params) if name in programs else {
                "unmapped": "Inductor did not generate it while opdiff recorded (a wrapper "
                            "from its cache, or compiled before capture started)"}
            setattr(mod, name, self._recorder(name, fn, params, path, program))

    def _recorder(self, kernel: str, fn: Callable[..., Any], params: list[str], path: str,
                  program: Program) -> Callable[..., Any]:
        s = self.session
        op = f"{KERNEL_PREFIX}.{kernel}"
        roles = [_role(p) for p in params]
        derived = inputs_of_outputs(program) if "steps" in program else {}
        # (only a tensor dump can replay it: a statistics dump is not made larger by programs)
        if s.config.task != "tensor":
            program = {}
        reads = inputs_read(program)
        # at mix, as the API layer: forward calls only (backward is judged through the
        # parameter gradients)
        forward_only = s.config.level != "L2"

        def record_kernel(*args: Any) -> Any:
            if s.own.active or not s.recording:
                return fn(*args)
            phase = Phase.BACKWARD if torch._C._current_graph_task_id() != -1 else Phase.FORWARD
            if forward_only and phase == Phase.BACKWARD:
                return fn(*args)
            pending = ins = None
            try:
                index = s.next_index(f"{op}.{phase}")
                name = record_name(op, phase, index, Kind.KERNEL)
                sel = s.selection
                if sel.selected(name) and (sel.want_forward if phase == Phase.FORWARD
                                           else sel.want_backward):
                    # its outputs are written through raw pointers and read through fresh
                    # views: dataflow by data address from here on (describe.py)
                    s.follow_buffers()
                    pending = s.begin(name, op, Kind.KERNEL, phase, index, None)
                    pending.record["compiled"] = _provenance(kernel, path)
                    if program:
                        pending.record["program"] = program
                    ins = [a for a, r in zip(args, roles) if r in ("in", "in_out")]
                    written = _storages([a for a, r in zip(args, roles) if r == "out"])
                    with s.own():
                        pending.record["inputs"] = _inputs(s, ins, roles, pending.record,
                                                           reads, written)
                    made = from_parameters(derived, pending.record["inputs"])
                    if made:
                        pending.record["compiled"]["from_parameters"] = made
            except Exception as exc:
                s.fail(pending, exc, op)
                if pending is not None:
                    pending.record.setdefault("inputs", [])
            out = fn(*args)
            outs = [a for a, r in zip(args, roles) if r in ("out", "in_out")]
            # written through raw pointers, unseen by version counters: what capture knows
            # of these buffers is stale (else a later read looks like a write outside torch)
            s.forget(outs)
            if pending is not None:
                s.finish(pending, outs, ins)
            return out
        return record_kernel


def _inputs(s: Any, ins: list[Any], roles: list[str], record: dict[str, Any], reads: set[int],
            written: set[int]) -> list[dict[str, Any]]:
    """A kernel's inputs: its `in_ptr` arguments, and its `in_out_ptr` ones where a recorded op
    made them or its program reads them (`reads`; otherwise Inductor may have handed the kernel
    a fresh buffer it writes before reading: shape and dtype only, as an `out=` tensor). An
    `in_ptr` argument no recorded op made whose memory the kernel is also handed to write
    (`written`: a `cat`'s buffer, written through aliases of its halves and read whole in the
    same kernel) is such a buffer too, unless its program reads it. Parameters, buffers and
    the root call's inputs are tagged as leaves (leaves.py)."""
    name = record["name"]
    described = s.describe_all(ins, name, Role.INPUT)
    tag_leaves(s, zip(ins, described), record)
    kinds = [r for r in roles if r in ("in", "in_out")]
    for i, (kind, desc) in enumerate(zip(kinds, described)):
        if not isinstance(desc, dict) or "producer" in desc or i in reads:
            continue
        if kind == "in_out" or (not desc.get("leaf") and _storages([ins[i]]) & written):
            described[i] = s.unread(ins[i], name, Role.INPUT, i)
    return described


def from_parameters(derived: dict[int, set[int]], inputs: list[Any]) -> list[list[Any]]:
    """[output index, [parameter fqns]] for each output a kernel computes from parameters and
    buffers alone (`derived`: the inputs each output is computed from, by its program), such as
    autocast's bf16 cast of a Linear's weight that Inductor fuses into another module's kernel:
    the comparison reads it as that parameter's, not as data handed between modules."""
    out = []
    for slot, read in sorted(derived.items()):
        descs = [inputs[i] if 0 <= i < len(inputs) else None for i in sorted(read)]
        fqns = [str(d["fqn"]) for d in descs if isinstance(d, dict)
                and d.get("leaf") in ("parameter", "buffer") and isinstance(d.get("fqn"), str)]
        if read and len(fqns) == len(read):
            out.append([slot, sorted(set(fqns))])
    return out


def _storages(tensors: list[Any]) -> set[int]:
    """The addresses of the storages of `tensors` (a view shares its base's)."""
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def _provenance(kernel: str, path: str) -> dict[str, Any]:
    """The `compiled` field of a kernel call: its wrapper, name (which lists the ops it fuses:
    `cpp_fused_mul_silu_5`), the modules of the nodes this call fuses (`modules`, where
    Inductor generated the wrapper while opdiff recorded: kernel_modules.py) and the user's line
    of the wrapper line calling it (from the stack traces Inductor keeps per wrapper line)."""
    out: dict[str, Any] = {"graph": path.rsplit("/", 1)[-1], "node": kernel,
                           "backend": INDUCTOR}
    try:
        from torch._inductor.codecache import PyCodeCache
        frame = sys._getframe(2)
        modules = modules_at(path, frame.f_lineno)
        if modules is not None:
            out["modules"] = modules
        frames = PyCodeCache.stack_frames_for_code(path, frame.f_lineno) or []
    except Exception:
        frames = []
    # innermost first: the user's line in the model (not opdiff's own, which a node traced
    # under the API layer's mode lists too)
    user = next((f for f in frames if not is_internal(str(f.get("filename") or ""))), None)
    if user is not None:
        out["source"] = [user.get("filename"), user.get("line")]
    return out
