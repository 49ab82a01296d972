"""Read what an ONNX graph says about itself: node order, producers, consumers, PyTorch origin.

    g = GraphIndex(model)
    for node in g.nodes:                  # topological order, even when the file is not sorted
        g.display_name(node), g.module_of(node), g.location_of(node)
    g.producer["/fc1/Gemm_output_0"]      # the node that writes a tensor

Only the top-level graph is indexed; nodes inside If/Loop bodies are compared at their boundary.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional

from ..store.frames import is_internal
from ..store.schema import Location

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?\n?(?P<code>[^\n]*)')


@dataclass(frozen=True)
class TensorInfo:
    """What the model declares (or shape inference derives) about one tensor."""
    name: str
    elem_type: int          # onnx.TensorProto data type, 0 when unknown
    shape: Optional[tuple]  # ints and dim names (str) or None for unknown dims; None if unknown rank


class GraphIndex:
    """Topological order, producers, consumers and exporter metadata of one ONNX model."""

    def __init__(self, model):
        graph = model.graph
        self.model = model
        self.initializers = {t.name: t for t in graph.initializer}
        self.inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.outputs = [o.name for o in graph.output]
        self.nodes = _topological(graph)
        self.producer = {}
        self.consumers: dict[str, list] = {}
        self.index = {}
        for i, node in enumerate(self.nodes):
            self.index[id(node)] = i
            for name in node.output:
                if name:
                    self.producer[name] = node
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self._names = _unique_names(self.nodes)

    def display_name(self, node) -> str:
        """The node's name, or `{op_type}_{index}` for nameless nodes (msit does the same)."""
        return self._names[id(node)]

    def position(self, node) -> int:
        return self.index[id(node)]

    def producer_op(self, tensor: str) -> Optional[str]:
        node = self.producer.get(tensor)
        return node.op_type if node is not None else None

    def metadata(self, node) -> dict:
        return {p.key: p.value for p in node.metadata_props}

    def module_of(self, node) -> Optional[str]:
        """PyTorch module path the exporter recorded for a node ("layer1.0.conv"), if any.

        The dynamo exporter writes `pkg.torch.onnx.name_scopes` (module paths, then the FX node);
        the TorchScript exporter encodes the scope in the node name (`/layer1/layer1.0/conv/Conv`).
        """
        scopes = self.metadata(node).get("pkg.torch.onnx.name_scopes")
        if scopes:
            try:
                names = ast.literal_eval(scopes)
            except (ValueError, SyntaxError):
                names = []
            paths = [n for n in names[:-1] if n]
            return paths[-1] if paths else None
        return scope_from_node_name(node.name)

    def location_of(self, node) -> Optional[Location]:
        """Source line from the dynamo exporter's stack trace: the innermost frame of user code."""
        return location_from_stack_trace(self.metadata(node).get("pkg.torch.onnx.stack_trace", ""))


def scope_from_node_name(name: str) -> Optional[str]:
    """Module path from a TorchScript-exporter node name: `/layer1/layer1.0/conv/Conv` -> `layer1.0.conv`.

    Scope parts are either attribute names (`conv`) or already full paths (`layer1.0`).
    """
    if not name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p][:-1]
    path = ""
    for part in parts:
        if path and part.startswith(path + "."):
            path = part
        else:
            path = f"{path}.{part}" if path else part
    return path or None


def location_from_stack_trace(text: str) -> Optional[Location]:
    frames = [m for m in _FRAME.finditer(text or "")]
    if not frames:
        return None
    # the one "user code" predicate of opdiff: torch, the tools and the standard library are not
    user = [m for m in frames if not is_internal(m.group("file"))]
    m = (user or frames)[-1]
    return Location(file=m.group("file"), line=int(m.group("line")), code=m.group("code").strip(),
                    function=m.group("func") or "")


def _unique_names(nodes) -> dict:
    names, seen = {}, set()
    for i, node in enumerate(nodes):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        names[id(node)] = name
    return names


def _topological(graph) -> list:
    """Nodes in a topological order (Kahn's algorithm, stable on file order).

    Converters append nodes at the end (fp16 conversion adds its output Cast last), so the
    file order is not always an execution order.
    """
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    nodes = list(graph.node)
    waiting = {id(n): {x for x in n.input if x and x not in available} for n in nodes}
    users: dict[str, list] = {}
    for n in nodes:
        for x in waiting[id(n)]:
            users.setdefault(x, []).append(n)
    ready = [n for n in nodes if not waiting[id(n)]]
    order_of = {id(n): i for i, n in enumerate(nodes)}
    out, done = [], set()
    import heapq

    heap = [(order_of[id(n)], id(n), n) for n in ready]
    heapq.heapify(heap)
    while heap:
        _, nid, n = heapq.heappop(heap)
        if nid in done:
            continue
        done.add(nid)
        out.append(n)
        for y in n.output:
            for user in users.get(y, []):
                w = waiting[id(user)]
                w.discard(y)
                if not w and id(user) not in done:
                    heapq.heappush(heap, (order_of[id(user)], id(user), user))
    # Nodes whose inputs never appear (outer-scope names, broken graphs) keep their file order.
    out.extend(n for n in nodes if id(n) not in done)
    return out
