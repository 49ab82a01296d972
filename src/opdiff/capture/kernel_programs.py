"""What an Inductor C++ kernel computes, as a small program over its arguments (for `opdiff check`).

While Inductor generates a kernel, it knows which post-grad FX nodes the kernel fuses (each
scheduler node's `origins`) and which graph buffer each C++ parameter holds (the kernel's
`KernelArgs`: `in_ptr0` is `buf4`, `out_ptr1` is `buf8`, `in_out_ptr0` is `buf16` on entry and
`buf20` on exit); a buffer holds the value of one FX node (`origin_node`), a graph input the
value of its placeholder. From these, each output parameter's FX node is rebuilt as a chain of
aten ops back to the nodes that the input parameters hold:

    {"steps": [{"op": "Aten.reshape", "args": [{"ref": "input", "index": 0},
                                                {"type": "list", "items": [...]}],
                "kwargs": {}, "node": "view_2"}, ...],      # ("item": k: its k-th result)
     "outputs": [{"output": 0, "value": {"ref": "step", "index": 4}}, ...]}

`index` counts the kernel record's inputs (its `in_ptr`/`in_out_ptr` arguments) and outputs
(`out_ptr`/`in_out_ptr`) in signature order, as the record lists them; a constant argument is a
scalar descriptor (`store/records.py`). Only nodes fused into the kernel, and views of its
arguments, become steps; an output whose node cannot be rebuilt so (an internal buffer of a
split reduction, a node of another kernel, a symbolic size, a non-aten op) is left out, and a
kernel with none is `{"unmapped": "<why, one line>"}`.

`ProgramWatch` collects these while Inductor generates code (it wraps
`CppScheduling.codegen_comment`, called once per kernel with its nodes while its arguments are
still at hand; nothing in the generated code changes) and hands a graph's programs over when
its wrapper module is loaded. A wrapper loaded from Inductor's cache was not generated in
this process: its kernels have no program (`opdiff check` says so).
"""
from __future__ import annotations

import logging
import operator
from typing import Any, Callable, Optional

import torch

from .. import ops
from ..store.records import encode_float
from .imports import Waiting, after_import

log = logging.getLogger("opdiff")
Program = dict[str, Any]
MAX_STEPS = 400

# Data movement only: a view of a kernel argument that Inductor folded into the kernel's
# indexing may not be listed among its origins.
_VIEWS = frozenset({"reshape", "view", "_unsafe_view", "expand", "permute", "unsqueeze",
                    "squeeze", "slice", "select", "transpose", "t", "clone", "alias"})


class Unmapped(Exception):
    """A value of the kernel cannot be rebuilt from its arguments (the message says why)."""


def _shape(node: Any) -> Optional[list[int]]:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return [int(s) for s in val.shape]
    except (TypeError, ValueError):        # a symbolic size
        return None


def _size(buffer: Any) -> Optional[list[int]]:
    try:
        return [int(s) for s in buffer.get_size()]
    except (TypeError, ValueError, AttributeError):
        return None


def _viewed(graph: Any, name: str) -> Optional[str]:
    """The buffer whose memory the buffer `name` is a view of (a `NonOwningLayout`), or None."""
    layout = getattr(graph.try_get_buffer(name), "layout", None)
    view = getattr(layout, "view", None)
    try:
        return view.get_name() if view is not None else None
    except Exception:
        return None


def _layout(graph: Any, name: str) -> Optional[tuple[Any, ...]]:
    """(size, stride, offset) of a buffer, None where any is symbolic or unknown."""
    try:
        layout = graph.try_get_buffer(name).get_layout()
        return (tuple(int(x) for x in layout.size), tuple(int(x) for x in layout.stride),
                int(layout.offset))
    except Exception:
        return None


def _contiguous(layout: tuple[Any, ...]) -> bool:
    size, stride, offset = layout
    expected, step = [], 1
    for n in reversed(size):
        expected.append(step)
        step *= n
    return offset == 0 and all(n == 1 or a == b
                               for n, a, b in zip(size, stride, reversed(expected)))


class _Builder:
    """Rebuilds FX nodes as program steps, demand-driven from the outputs' nodes."""

    def __init__(self, inputs: dict[Any, Any], fused: set[Any],
                 groups: Optional[dict[Any, list[Any]]] = None) -> None:
        self.inputs, self.fused = inputs, fused
        self.groups = groups or {}      # decomposition key -> its nodes, in graph order
        self.steps: list[dict[str, Any]] = []
        self.index: dict[Any, int] = {}

    def ref(self, node: Any) -> dict[str, Any]:
        if node in self.inputs:
            return {"ref": "input", "index": self.inputs[node]}
        if node in self.index:
            return {"ref": "step", "index": self.index[node]}
        undecomposed = self.undecomposed(node)
        if undecomposed is not None:
            return undecomposed
        whole = node         # (the node whose value the step makes)
        item: Optional[int] = None
        picked = _item(node)
        if picked is not None:      # (one result of a multi-result op: `var_mean(x)[1]`)
            node, item = picked
        op, args, kwargs = _call(node)
        if node not in self.fused and op.split(".", 1)[1] not in _VIEWS:
            raise Unmapped(f"it reads {node.name} ({op}), which is neither one of its arguments "
                           f"nor fused into it")
        if len(self.steps) >= MAX_STEPS:
            raise Unmapped(f"it fuses more than {MAX_STEPS} ops")
        step = {"op": op, "args": [self.value(a) for a in args],
                "kwargs": {str(k): self.value(v) for k, v in kwargs.items()}, "node": node.name}
        if item is not None:
            step["item"] = item
        self.index[whole] = len(self.steps)
        self.steps.append(step)
        return {"ref": "step", "index": self.index[whole]}

    def undecomposed(self, node: Any) -> Optional[dict[str, Any]]:
        """The op a decomposition replaced, as one step, where `node` is the last node of the
        whole decomposition of a one-tensor op (`aten.silu(x)` decomposed as
        `x * sigmoid(x)`): the reference is then the op itself, not what the decomposition
        says it is (a wrong decomposition is a compiler bug this judges)."""
        group = self.groups.get(_decomposed_key(node))
        if not group or node is not group[-1] or not all(n in self.fused for n in group):
            return None
        outside = [a for n in group for a in n.all_input_nodes if a not in group]
        if len({id(a) for a in outside}) != 1:
            return None
        original = node.meta["original_aten"]
        step = {"op": f"Aten.{original.overloadpacket.__name__}", "args": [self.ref(outside[0])],
                "kwargs": {}, "node": node.name, "decomposed": [n.name for n in group]}
        self.index[node] = len(self.steps)
        self.steps.append(step)
        return {"ref": "step", "index": self.index[node]}

    def value(self, v: Any) -> dict[str, Any]:
        if isinstance(v, torch.fx.Node):
            return self.ref(v)
        if isinstance(v, bool):
            return {"type": "bool", "value": v}
        if isinstance(v, int):
            return {"type": "int", "value": v}
        if isinstance(v, float):
            return {"type": "float", "value": encode_float(v)}
        if v is None:
            return {"type": "none"}
        if isinstance(v, torch.dtype):
            return {"type": "dtype", "value": str(v)}
        if isinstance(v, torch.device):
            return {"type": "device", "value": str(v)}
        if isinstance(v, (torch.memory_format, torch.layout)):
            return {"type": "object", "value": str(v)}
        if isinstance(v, (list, tuple)):
            return {"type": "list", "items": [self.value(x) for x in v]}
        raise Unmapped(f"an argument of type {type(v).__name__} ({str(v)[:40]})")


def _item(node: Any) -> Optional[tuple[Any, int]]:
    """(the multi-result aten op's node, which result) for `operator.getitem(node, k)`."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return None
    source, k = node.args
    if not isinstance(source, torch.fx.Node) or not isinstance(k, int) or isinstance(k, bool) \
            or not isinstance(source.target, torch._ops.OpOverload):
        return None
    return source, k


def _decomposed_key(node: Any) -> Optional[tuple[Any, Any]]:
    """(original op, sequence number) of a node made by decomposing an op whose only argument
    is one tensor (`aten.silu.default(Tensor self)`), else None."""
    meta = getattr(node, "meta", None) or {}
    original, seq = meta.get("original_aten"), meta.get("seq_nr")
    target = node.target
    if not isinstance(original, torch._ops.OpOverload) or seq is None \
            or original.namespace != "aten" or (isinstance(target, torch._ops.OpOverload)
                                                and target.name() == original.name()):
        return None
    args = original._schema.arguments
    if len(args) != 1 or str(args[0].type) != "Tensor" or len(original._schema.returns) != 1:
        return None
    return original.name(), seq      # (one op can be two OpOverload objects)


def _decompositions(graph: Any) -> dict[Any, list[Any]]:
    """The nodes of each decomposed one-tensor op call in the graph, in graph order."""
    out: dict[Any, list[Any]] = {}
    for node in graph.graph.nodes:
        key = _decomposed_key(node)
        if key is not None:
            out.setdefault(key, []).append(node)
    return out


def _call(node: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """(replay op name, args, kwargs) of an FX node: aten ops by their overload packet, and the
    two prims Inductor's decompositions leave (a dtype conversion, a range)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        raise Unmapped(f"it computes {node.name} with {str(target)[:60]}, not an aten op")
    ns, name = target.namespace, target.overloadpacket.__name__
    if ns == "aten":
        return f"Aten.{name}", tuple(node.args), dict(node.kwargs)
    if ns == "prims" and name == "convert_element_type" and len(node.args) == 2:
        return "Aten._to_copy", (node.args[0],), {"dtype": node.args[1]}
    if ns == "prims" and name == "iota" and len(node.args) == 1:
        length, kw = node.args[0], node.kwargs
        start, step = kw.get("start", 0), kw.get("step", 1)
        if all(isinstance(x, int) for x in (length, start, step)):
            return "Aten.arange", (start, start + step * length, step), {
                "dtype": kw.get("dtype"), "device": kw.get("device")}
    raise Unmapped(f"it computes {node.name} with {ns}.{name}, which replay does not run")


class GraphFacts:
    """What every kernel of one graph looks up: its placeholders by name and its decomposed
    one-tensor op calls (read once per graph, not once per kernel)."""

    def __init__(self, graph: Any) -> None:
        self.placeholders = {n.name: n for n in graph.graph.nodes if n.op == "placeholder"}
        self.decompositions = _decompositions(graph)


def program_of(nodes: list[Any], args: Any, graph: Any,
               facts: Optional[GraphFacts] = None) -> Program:
    """The program of one kernel: `nodes` its scheduler nodes, `args` its `KernelArgs`, `graph`
    Inductor's `GraphLowering`. Parameters are named as in the C++ signature (`in_ptr0`);
    `bind` turns them into the record's input and output indices."""
    fused: set[Any] = set()
    written: set[str] = set()
    for snode in nodes:
        ir = getattr(snode, "node", None)
        if ir is None or type(ir).__name__ == "CppTemplateBuffer":
            return {"unmapped": "a C++ template kernel, whose code is not made of FX nodes"}
        fused |= set(getattr(ir, "origins", ()) or ())
        written |= set(snode.get_buffer_names())
    # a buffer written here through a view of another (the parts of a `cat`, which Inductor
    # writes in place into the cat's buffer) makes that one written here too: what the
    # kernel is handed for it on entry is not its value
    written |= {alias for name in written if (alias := _viewed(graph, name))}
    facts = facts or GraphFacts(graph)
    placeholders = facts.placeholders

    # a buffer some op writes in place (an optimizer's `add_` into a parameter, a running
    # statistic's `copy_`) holds its node's value only until then: never mapped
    scheduler = getattr(graph, "scheduler", None)
    mutated = set(getattr(graph, "mutated_inputs", ()) or ()) | set(
        getattr(scheduler, "mutation_real_name", {}).values())

    def node_of(buf: str) -> Any:
        """The FX node whose value the buffer holds, if its shape is the node's."""
        if buf in mutated:
            return None
        if buf in graph.graph_inputs:
            node = placeholders.get(buf)
            size = _size(graph.graph_inputs[buf])
        else:
            b = graph.try_get_buffer(buf)
            node, size = getattr(b, "origin_node", None), _size(b)
        if node is None or size is None or _shape(node) != size:
            return None
        return node

    entry: dict[str, str] = {}      # parameter -> buffer it holds on entry
    reshaped: dict[str, list[int]] = {}     # parameter -> the size its entry value has
    exit: dict[str, str] = {}       # parameter -> buffer it holds on exit
    inplace = args.inplace_buffers     # (as `KernelArgs.cpp_argdefs`: these are in_out_ptr)
    for buf, inner in args.input_buffers.items():
        if isinstance(inner, str) and inner.startswith("in_ptr") and buf not in inplace \
                and buf not in written:
            entry[inner] = buf
    for buf, inner in args.output_buffers.items():
        if isinstance(inner, str) and inner.startswith("out_ptr") and buf not in inplace:
            exit[inner] = buf
    for inplaced in inplace.values():
        inner, names = getattr(inplaced, "inner_name", None), getattr(inplaced, "other_names", None)
        if isinstance(inner, str) and inner.startswith("in_out_ptr") and names:
            # (the kernel is handed the last name's tensor: the first one's value where both
            # see the memory alike, or reshaped where both are contiguous from its start)
            first, last = _layout(graph, names[0]), _layout(graph, names[-1])
            if names[0] not in written and first is not None and last is not None:
                if first == last:
                    entry[inner] = names[0]
                elif _contiguous(first) and _contiguous(last):
                    entry[inner] = names[0]
                    reshaped[inner] = list(first[0])
            if names[-1] in written:
                exit[inner] = names[-1]
    inputs = {}
    for param, buf in entry.items():
        node = node_of(buf)
        if node is not None and node not in inputs:
            inputs[node] = param
    builder = _Builder({n: p for n, p in inputs.items() if p not in reshaped}, fused,
                       facts.decompositions)
    for node, param in inputs.items():      # (inputs by parameter name until `bind`)
        if param in reshaped:
            builder.index[node] = len(builder.steps)
            builder.steps.append({"op": "Aten.reshape", "args": [
                {"ref": "input", "index": param}, builder.value(reshaped[param])],
                "kwargs": {}, "node": node.name})
    outputs, why = [], ""
    for param, buf in sorted(exit.items()):
        node = node_of(buf)
        if node is None:
            why = why or f"its output {buf} holds no FX node's value"
            continue
        try:
            outputs.append({"output": param, "value": builder.ref(node)})
        except Unmapped as exc:
            why = why or str(exc)
    if not outputs:
        return {"unmapped": why or "it has no output"}
    return {"steps": builder.steps, "outputs": outputs}


def bind(program: Program, params: list[str]) -> Program:
    """The program with parameter names replaced by the record's input and output indices
    (`params`: the C++ signature's parameter names, in order)."""
    if "unmapped" in program:
        return program
    ins = [p for p in params if p.startswith(("in_ptr", "in_out_ptr"))]
    outs = [p for p in params if p.startswith(("out_ptr", "in_out_ptr"))]

    def fix(v: Any) -> Any:
        if isinstance(v, dict) and v.get("ref") == "input":
            return {"ref": "input", "index": ins.index(v["index"])}
        if isinstance(v, dict) and v.get("type") == "list":
            return {"type": "list", "items": [fix(x) for x in v["items"]]}
        return v
    try:
        steps = [dict(s, args=[fix(a) for a in s["args"]],
                      kwargs={k: fix(a) for k, a in s["kwargs"].items()})
                 for s in program["steps"]]
        outputs = [{"output": outs.index(o["output"]), "value": fix(o["value"])}
                   for o in program["outputs"]]
    except ValueError:
        return {"unmapped": "its parameters are not those Inductor's arguments named"}
    return {"steps": steps, "outputs": outputs}


def inputs_read(program: Program) -> set[int]:
    """The record inputs a bound program reads."""
    found: set[int] = set()

    def walk(v: Any) -> None:
        if isinstance(v, dict) and v.get("ref") == "input":
            found.add(v["index"])
        elif isinstance(v, dict) and v.get("type") == "list":
            for x in v["items"]:
                walk(x)
    for step in program.get("steps", ()):
        for v in list(step["args"]) + list(step["kwargs"].values()):
            walk(v)
    return found


def inputs_of_outputs(program: Program) -> dict[int, set[int]]:
    """Per output index of a bound program, the record inputs its value is computed from
    (through its steps; constants aside). An output computed through a step that draws random
    numbers is left out."""
    steps = program.get("steps", ())
    memo: dict[int, Optional[set[int]]] = {}

    def of(v: Any) -> Optional[set[int]]:
        if isinstance(v, dict) and v.get("ref") == "input":
            return {v["index"]}
        if isinstance(v, dict) and v.get("ref") == "step":
            i = v["index"]
            if i not in memo:
                memo[i] = None      # (a cycle cannot be: steps only read earlier ones)
                step = steps[i]
                found: Optional[set[int]] = set()
                if ops.traits(str(step.get("op"))).random:
                    found = None
                for a in list(step["args"]) + list(step["kwargs"].values()):
                    got = of(a)
                    found = None if got is None or found is None else found | got
                memo[i] = found
            return memo[i]
        if isinstance(v, dict) and v.get("type") == "list":
            out: Optional[set[int]] = set()
            for x in v["items"]:
                got = of(x)
                out = None if got is None or out is None else out | got
            return out
        return set()
    result: dict[int, set[int]] = {}
    for o in program.get("outputs", ()):
        found = of(o["value"])
        if found is not None:
            result[o["output"]] = found
    return result


class ProgramWatch:
    """Collects each kernel's program while Inductor generates code in this process (see the
    module docstring): `start()`, then `take()` in the wrapper's `load_by_key_path`, `stop()`."""

    def __init__(self) -> None:
        # id of the graph -> (the graph, held so that its id is not reused while it is
        # here; what its kernels look up; its kernels' programs)
        self._by_graph: dict[int, tuple[Any, GraphFacts, dict[str, Program]]] = {}
        self._original: Optional[Callable[..., Any]] = None
        self._owner: Any = None
        self._waiting: Optional[Waiting] = None

    def start(self) -> None:
        # (the C++ code generator is imported by the first compile, maybe after this)
        self._waiting = after_import("torch._inductor.codegen.cpp", self._hook)

    def _hook(self, cpp: Any) -> None:
        CppScheduling = getattr(cpp, "CppScheduling", None)
        if CppScheduling is None:   # no C++ backend in this torch: kernels stay without programs
            return
        original = CppScheduling.__dict__["codegen_comment"]
        watch = self

        def codegen_comment(sched: Any, node_schedule: Any, kernel_name: Any = None) -> Any:
            watch._collect(sched, node_schedule, kernel_name)
            return original(sched, node_schedule, kernel_name)
        self._original, self._owner = original, CppScheduling
        CppScheduling.codegen_comment = codegen_comment

    def stop(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        if self._original is not None:
            self._owner.codegen_comment = self._original
            self._original = self._owner = None
        self._by_graph.clear()

    def _collect(self, sched: Any, node_schedule: Any, kernel_name: Any) -> None:
        try:
            from torch._inductor.virtualized import V
            graph = V.graph
            if id(graph) not in self._by_graph:
                self._by_graph[id(graph)] = (graph, GraphFacts(graph), {})
            _, facts, kernels = self._by_graph[id(graph)]
            if not isinstance(kernel_name, str) or kernel_name in kernels:
                return      # (the same code made twice is one kernel, the same computation)
            try:
                program = program_of(list(node_schedule), sched.kernel_group.args, graph, facts)
            except Unmapped as exc:
                program = {"unmapped": str(exc)}
            kernels[kernel_name] = program
        except Exception as exc:   # never let the record break the compile
            log.warning("no program for Inductor kernel %s: %s", kernel_name, exc)

    def take(self) -> dict[str, Program]:
        """The programs of the graph whose wrapper is being loaded now ({} for a cache hit)."""
        try:
            from torch._inductor.virtualized import V
            found = self._by_graph.pop(id(V.graph), None)
        except Exception:
            return {}
        return found[2] if found is not None and found[0] is V.graph else {}
