"""Which modules each call of Inductor's generated code came from (level mix under Inductor).

At mix the comparison judges an eager module call against the compiled calls made of that
module's nodes (`comparison/compiled_modules.py`), so a kernel record must say the modules of
every FX node it fuses. Inductor knows them only while it generates a wrapper: each scheduler
node's `origins` are post-grad FX nodes whose `nn_module_stack` names the module that made them.
One kernel's code may be called more than once (the same fused code for layer 0 and layer 1
is one `cpp_fused_mul_silu_3`), so the modules belong to each call *line* of the wrapper, not
to the kernel's name.

`ModuleWatch` wraps Inductor's code generation steps, in the order Inductor writes the
wrapper's `call` function: `CppScheduling.define_kernel` (a C++ kernel group about to be called;
its scheduled nodes), `TritonScheduling.define_kernel` (the same for a Triton kernel, called
through its launcher, `name.run(`: not run on a GPU yet) and `Scheduler.codegen_extern_call`
(an extern kernel: mm, bmm). When the wrapper module is loaded, the i-th definition of a
kernel is its i-th call line in the file, and the i-th extern call the i-th `extern_kernels.`
line or call of an op Inductor falls back to, `torch.ops.aten.<op>.<overload>(` (SDPA on the
CPU; only where the counts agree). What it
found is kept for the process by wrapper file (`lines_of`): a wrapper compiled in one step runs
again in later ones; and in a small file beside the wrapper in Inductor's cache directory
(`<wrapper>.py.opdiff-modules.json`), for a later process that Inductor's cache hands the same
wrapper without generating it. Nothing generated changes.

A node run by a module outside the model's tree (dynamo's `G[...]`: transformers' global
`apply_rotary_pos_emb`, a hub kernel) counts as the innermost module of the tree on its stack,
where eager records its ops. A call whose node lacks a module (`nn_module_stack`) gets the
root's `""`; a wrapper generated
while opdiff did not watch (and not cached with that file) names no module, and the comparison
judges no module call made of its calls (compiled.py's note says so).
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, Callable, Optional

from .imports import Waiting, after_import

log = logging.getLogger("opdiff")

_KEEP = 256                 # wrappers remembered per process (each a few hundred lines)
_known: dict[str, dict[int, list[str]]] = {}     # wrapper file -> call line -> modules
_CALL = re.compile(r"^\s+(\w+)\(")
# a Triton kernel's call through its launcher: `triton_poi_fused_add_0.run(buf0, ..., stream=stream0)`
_LAUNCH = re.compile(r"^\s+(\w+)\.run\(")
# an extern kernel call: `extern_kernels.mm(...)`, or an op Inductor falls back to, called by
# its overload (`buf15 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(`)
_EXTERN = re.compile(r"^\s+(?:\w+ = )?(?:extern_kernels\.\w+|torch\.ops\.\w+\.\w+\.\w+)\(")


SIDECAR = ".opdiff-modules.json"


def lines_of(path: str) -> dict[int, list[str]]:
    """The modules of each call line of a wrapper generated while a watch ran, in this process
    or, through the file it left beside the wrapper (`SIDECAR`), in an earlier one whose
    wrapper Inductor's cache gives back ({} otherwise)."""
    found = _known.get(path)
    if found is None:
        found = _known[path] = _read_sidecar(path)
    return found


def modules_at(path: str, line: int) -> Optional[list[str]]:
    """The modules of the nodes the wrapper's call at `line` computes, or None where unknown."""
    found = _known.get(path)
    if found is None:
        found = lines_of(path)
    return found.get(line)


def _read_sidecar(path: str) -> dict[int, list[str]]:
    try:
        with open(path + SIDECAR, encoding="utf-8") as f:
            data = json.load(f)
        return {int(line): [str(m) for m in modules] for line, modules in data.items()
                if isinstance(modules, list)}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _write_sidecar(path: str, lines: dict[int, list[str]]) -> None:
    """Beside the wrapper in Inductor's cache directory (a cache hit in a later process writes
    the same source to the same file name, its hash): best effort."""
    try:
        tmp = f"{path}{SIDECAR}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({str(k): v for k, v in lines.items()}, f)
        os.replace(tmp, path + SIDECAR)
    except OSError as exc:
        log.debug("opdiff: cannot keep the modules of %s: %s", path, exc)


# Data movement only: a view Inductor folds into a call's indexing (the `view` of a norm's
# output that a Linear's mm reads) computes nothing there; its module is not the call's.
_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand",
                    "unsqueeze", "squeeze", "slice", "select", "alias", "as_strided"})


# A dtype cast computes no value of its own either: autocast's bf16 cast of a Linear's weight
# (or of its input) that Inductor fuses into the kernel of the code before the Linear names the
# Linear only through the cast; that kernel's other code is not the Linear's (the comparison
# reads a cast of parameters alone as those parameters': `compiled.from_parameters`).
_CASTS = frozenset({"convert_element_type", "_to_copy"})


def _is_view(node: Any) -> bool:
    packet = getattr(getattr(node, "target", None), "overloadpacket", None)
    return getattr(packet, "__name__", None) in _VIEWS | _CASTS


def node_modules(fx_nodes: Any) -> list[str]:
    """The innermost module of each FX node that computes (views and dtype casts left out,
    unless all are; `""` for a node without a module), sorted, unique."""
    from .compiled import module_path     # (compiled.py asks this module at run time)
    fx_nodes = list(fx_nodes)
    computing = [n for n in fx_nodes if not _is_view(n)]
    found = set()
    for node in computing or fx_nodes:
        meta = getattr(node, "meta", None) or {}
        stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack") or {}
        # (a module outside the model's tree, a global such as transformers' hub-kernel
        # `apply_rotary_pos_emb`, runs inside the innermost module of the tree that called it:
        # eager records its ops there, its call is not recorded)
        inner = [entry[0] for entry in stack.values() if not str(entry[0]).startswith("G[")]
        found.add(module_path(inner[-1]) if inner else "")
    return sorted(found)


def _origins(snodes: Any) -> list[Any]:
    out: list[Any] = []
    for snode in snodes:
        for inner in snode.get_nodes():
            ir = getattr(inner, "node", None)
            if ir is not None:
                out += list(ir.get_origins())
    return out


def scheduled(node_schedule: Any) -> list[Any]:
    """The scheduler nodes of a Triton kernel's node schedule (which also holds markers that
    open and close its reductions)."""
    return [n for n in node_schedule if callable(getattr(n, "get_nodes", None))]


def _computed(snode: Any) -> list[Any]:
    """The FX node an extern kernel computes (its buffer's `origin_node`: the `mm`, not the
    nodes whose values Inductor realized into its inputs), else its origins."""
    node = getattr(getattr(snode, "node", None), "origin_node", None)
    return [node] if node is not None else _origins([snode])


class ModuleWatch:
    """Collects each call's modules while Inductor generates a wrapper in this process:
    `start()`, then `loaded(path)` when the wrapper module is loaded, `stop()`."""

    def __init__(self) -> None:
        # id of the graph -> (the graph, held so that its id is not reused; its calls in order:
        # ("kernel", name, modules) or ("extern", "", modules))
        self._by_graph: dict[int, tuple[Any, list[tuple[str, str, list[str]]]]] = {}
        self._undo: list[tuple[Any, str, Callable[..., Any]]] = []
        self._waiting: list[Waiting] = []

    def start(self) -> None:
        # (the generators are imported by the first compile, maybe after this)
        self._waiting = [after_import("torch._inductor.codegen.cpp", self._hook_cpp),
                         after_import("torch._inductor.codegen.triton", self._hook_triton),
                         after_import("torch._inductor.scheduler", self._hook_scheduler)]

    def stop(self) -> None:
        for waiting in self._waiting:
            waiting.cancel()
        self._waiting = []
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        self._by_graph.clear()

    def _wrap(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Any]) -> None:
        original = owner.__dict__.get(name)
        if original is None:        # another torch: its calls stay without modules
            return
        self._undo.append((owner, name, original))
        setattr(owner, name, make(original))

    def _hook_cpp(self, cpp: Any) -> None:
        watch = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def define_kernel(sched: Any, src_code: Any, nodes: Any, *args: Any, **kw: Any) -> Any:
                name = original(sched, src_code, nodes, *args, **kw)
                watch._note("kernel", name, lambda: _origins(nodes))
                return name
            return define_kernel
        if getattr(cpp, "CppScheduling", None) is not None:
            self._wrap(cpp.CppScheduling, "define_kernel", make)

    def _hook_triton(self, triton: Any) -> None:
        watch = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def define_kernel(sched: Any, src_code: Any, node_schedule: Any, *args: Any, **kw: Any) -> Any:
                name = original(sched, src_code, node_schedule, *args, **kw)
                watch._note("kernel", name, lambda: _origins(scheduled(node_schedule)))
                return name
            return define_kernel
        if getattr(triton, "TritonScheduling", None) is not None:
            self._wrap(triton.TritonScheduling, "define_kernel", make)

    def _hook_scheduler(self, scheduler: Any) -> None:
        watch = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def codegen_extern_call(sched: Any, node: Any, *args: Any, **kw: Any) -> Any:
                # (a fallback's results taken apart, `buf16 = buf15[0]`: no call of its own)
                if type(getattr(node, "node", None)).__name__ != "MultiOutput":
                    watch._note("extern", "", lambda: _computed(node))
                return original(sched, node, *args, **kw)
            return codegen_extern_call
        if getattr(scheduler, "Scheduler", None) is not None:
            self._wrap(scheduler.Scheduler, "codegen_extern_call", make)

    def _note(self, what: str, name: Any, origins: Callable[[], list[Any]]) -> None:
        try:
            from torch._inductor.virtualized import V
            graph = V.graph
            calls = self._by_graph.setdefault(id(graph), (graph, []))[1]
            calls.append((what, str(name), node_modules(origins())))
        except Exception as exc:    # never let the record break the compile
            log.warning("opdiff: no modules for an Inductor call: %s", exc)

    def loaded(self, path: str) -> None:
        """The wrapper of the graph being generated now was written to `path`: match its call
        lines with the calls collected (nothing for a cache hit)."""
        try:
            from torch._inductor.virtualized import V
            found = self._by_graph.pop(id(V.graph), None)
            if found is None or found[0] is not V.graph:
                return
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except Exception:
            return
        if len(_known) >= _KEEP:
            _known.clear()
        _known[path] = match_lines(text, found[1])
        _write_sidecar(path, _known[path])


def match_lines(text: str, calls: list[tuple[str, str, list[str]]]) -> dict[int, list[str]]:
    """Call line (1-based) -> modules: the i-th definition of a kernel at its i-th call line
    (`name(` for a C++ kernel, `name.run(` for a Triton one),
    the i-th extern call at the i-th extern line (`_EXTERN`) where both counts agree."""
    body = text.split("\n")
    start = next((i for i, line in enumerate(body) if line.lstrip().startswith("def call(")), 0)
    kernels: dict[str, list[list[str]]] = {}
    externs: list[list[str]] = []
    for what, name, modules in calls:
        if what == "kernel":
            kernels.setdefault(name, []).append(modules)
        else:
            externs.append(modules)
    out: dict[int, list[str]] = {}
    extern_lines: list[int] = []
    for i in range(start, len(body)):
        line = body[i]
        if _EXTERN.match(line):
            extern_lines.append(i + 1)
            continue
        m = _CALL.match(line) or _LAUNCH.match(line)
        if m and kernels.get(m.group(1)):
            out[i + 1] = kernels[m.group(1)].pop(0)
    if len(extern_lines) == len(externs):
        out.update(zip(extern_lines, externs))
    return out


__all__ = ["ModuleWatch", "lines_of", "modules_at", "node_modules", "match_lines", "scheduled"]
