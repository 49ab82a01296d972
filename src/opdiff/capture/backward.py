"""Backward capture without full backward hooks (in-place safe, compile friendly).

For an op whose outputs require grad, the autograd node that produced them gets a hook
`node.register_hook(fn(grad_inputs, grad_outputs))`: grad_outputs are the gradients w.r.t. the
op's outputs (the backward record's inputs), grad_inputs the gradients w.r.t. its inputs (the
backward record's outputs). An API that builds several autograd nodes (a composite op) is
hooked where its nodes hand gradients to its arguments' nodes (the boundary edges). Modules use
gradient groups (`on_all_grads`) on their outputs and on their inputs, which give the total
gradient of each.

No hook may hold the node it is registered on: that is a reference cycle through C++ that
Python's collector cannot see, and it keeps the whole graph (saved activations included) alive.
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from ..store.schema import Kind, Phase, Role, record_name
from .describe import tensors_in
from .guards import capturing_graph


def grad_nodes(outputs) -> list:
    """Distinct autograd nodes of the output tensors that require grad."""
    nodes: list = []
    for t in tensors_in(outputs):
        fn = t.grad_fn if t.requires_grad else None
        if fn is not None and all(fn is not n for n in nodes):
            nodes.append(fn)
    return nodes


def in_backward() -> bool:
    """True while autograd's engine runs a node (e.g. checkpoint recomputation)."""
    return torch._C._current_autograd_node() is not None


def input_edges(values) -> list:
    """Where the gradient of each argument tensor that requires grad goes, taken before the op
    runs (an in-place op moves its input's edge onto its own node): (index, node, output_nr,
    tensor).

    For a leaf the node is None: its AccumulateGrad node is matched later through the tensor
    (creating it here would take an op). The list must be kept while the nodes are matched by
    id(): it holds their Python objects, which autograd would otherwise build anew, under new ids.
    """
    return [(i, t.grad_fn, t.output_nr, t) for i, t in enumerate(tensors_in(values)) if t.requires_grad]


def op_nodes(roots: list, first_seq: int, last_seq: int) -> tuple[list, list]:
    """The autograd nodes one call created (reachable from its outputs' nodes `roots`, sequence
    nr in [first, last)), and the edges leaving them: (node, k, next node, its input nr)."""
    found, leaving, todo = {}, [], list(roots)
    while todo:
        node = todo.pop()
        if id(node) in found:
            continue
        found[id(node)] = node
        for k, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            if first_seq <= nxt._sequence_nr() < last_seq:
                todo.append(nxt)
            else:   # AccumulateGrad nodes have the largest sequence number: always outside
                leaving.append((node, k, nxt, nr))
    return list(found.values()), leaving


def backward_name(session, pending, kind: str = Kind.API) -> str | None:
    """The name of the backward record of the call `pending` (sink.PendingRecord), or None when
    `scope` or `list` leave it out."""
    name = record_name(pending.record["op"], Phase.BACKWARD, pending.index, kind)
    return name if session.selected(name, forward_selected=True) else None


def hook_api_backward(session, pending, outputs, first_seq: int | None = None) -> None:
    """Arrange for the backward record of the API call `pending` (its sink.PendingRecord:
    `{op}.{index}.backward`) to be recorded when autograd reaches this op.

    Inputs of the record: the gradient w.r.t. every output tensor (None where none flowed).
    Outputs: the gradient this call sends to each of its tensor arguments, summed over the
    edges of the nodes it created (a composite op such as F.linear on 3-D input builds several).
    """
    # (plain loops: this runs for every recorded op whose output requires grad)
    if isinstance(outputs, torch.Tensor):
        if not outputs.requires_grad:
            return
        out_tensors = [outputs]
    else:
        out_tensors = tensors_in(outputs)
        if not any(t.requires_grad for t in out_tensors):
            return
    name = backward_name(session, pending)
    if name is None:
        return
    last_seq = torch._C._autograd._get_sequence_nr()
    first = first_seq if first_seq is not None else last_seq - 1
    roots = [fn for fn in grad_nodes(out_tensors) if first <= fn._sequence_nr() < last_seq]
    if not roots:
        return
    nodes, leaving = op_nodes(roots, first, last_seq)
    targets: dict = {}
    leaves: dict = {}
    n_inputs = 0
    for i, fn, nr, t in pending.edges or ():
        if fn is not None:
            targets[(id(fn), nr)] = i
            if isinstance(fn, BackwardCFunction):
                fn.register_hook(_after_custom(session))
        else:
            leaves[id(t)] = i
        if i >= n_inputs:
            n_inputs = i + 1
    # Boundary edges: from a node of this call to the node that owns one of its arguments' grads.
    boundary: dict[int, tuple[Any, list]] = {}
    fed: set = set()
    summed: set = set()     # arguments fed by several edges
    for node, k, nxt, nr in leaving:
        i = targets.get((id(nxt), nr))
        if i is None and leaves and type(nxt).__name__ == "AccumulateGrad":
            i = leaves.get(id(nxt.variable))
        if i is not None:
            entry = boundary.get(id(node))
            if entry is None:
                entry = boundary[id(node)] = (node, [])
            entry[1].append((k, i))
            if i in fed:
                summed.add(i)
            fed.add(i)
    # Gradients w.r.t. the outputs: what each output's node receives (a node pre-hook sees the
    # gradient of the value the op produced, even if the tensor was later changed in place).
    # An output's node is the call's when it is one of the roots.
    by_node: dict[int, tuple[Any, list]] = {}
    root_ids = {id(fn) for fn in roots}
    for j, t in enumerate(out_tensors):
        fn = t.grad_fn if t.requires_grad else None
        if fn is not None and id(fn) in root_ids:
            entry = by_node.get(id(fn))
            if entry is None:
                entry = by_node[id(fn)] = (fn, [])
            entry[1].append((t.output_nr, j))
    op_backward = BackwardRecord(session, pending, name, len(out_tensors), n_inputs)
    op_backward.expect(len(boundary), summed)
    # A node with a post hook anyway sees the same gradients there (usually the op's only node).
    for key, (node, positions) in boundary.items():
        node.register_hook(op_backward.boundary(positions, by_node.pop(key, (None, ()))[1]))
    for node, slots in by_node.values():
        node.register_prehook(op_backward.output_node(slots))
    if not boundary:  # no argument needs a gradient (e.g. a factory with requires_grad=True)
        nodes[0].register_hook(lambda grad_inputs, grad_outputs: op_backward.emit())


def _after_custom(session):
    """The post hook of a custom autograd Function's node that a recorded op reads from. Its
    backward is user code autograd runs with no capture mode active: it may write the
    gradients it is given in place without a version bump (Megatron's copy-to-region function
    all-reduces its gradient), so what capture described of them before is stale."""
    def hook(grad_inputs, grad_outputs):
        if session.recording:
            try:
                session.written_unseen((grad_inputs, grad_outputs))
            except Exception as exc:  # noqa: BLE001 - capture must not break the backward
                session.failed("a custom autograd Function's backward", exc)
    return hook


class BackwardRecord:
    """One call's backward record while its gradients arrive: made from the call's pending
    record (its name, op, kind, module and stack), filled by the hooks backward.py registers
    (`boundary` and `output_node` for an API call, `gradients` for a module call), emitted once.

    Each gradient is described as it arrives, and no hook keeps it afterwards: a gradient held
    until the op's last node ran would make AccumulateGrad copy it into `.grad` instead of
    taking it (torch takes a gradient only nobody else holds), a copy of every parameter's
    gradient, which the parameter-gradient record then described again. Only an argument fed by
    several edges of the call keeps its parts until they are summed. With task="overflow_check"
    an API call's tensors are kept for the check at the end, as the check reads them.
    """

    __slots__ = ("session", "record", "waiting", "grads_out", "grads_in", "done", "summed", "keep",
                 "checked")

    def __init__(self, session, pending, name: str, n_outputs: int = 0, n_inputs: int = 0):
        forward = pending.record
        self.session = session
        self.record = {"name": name, "op": forward["op"], "kind": forward["kind"],
                       "phase": Phase.BACKWARD, "module": forward["module"], "forward": forward["name"],
                       "stack": forward["stack"], "inputs": [None] * n_outputs,
                       "outputs": [None] * n_inputs}
        # (the overflow check reads an API call's gradients; a module's are not checked)
        self.checked = forward["kind"] == Kind.API
        self.keep = self.checked and session.overflow is not None
        self.grads_out: list = [None] * n_outputs   # tensors, or their descriptors
        self.grads_in: list = [None] * n_inputs
        self.waiting = 0
        self.summed: set = set()
        self.done = False

    def expect(self, waiting: int, summed: set) -> None:
        """An API call: `waiting` boundary nodes still to run; `summed`, the arguments fed by
        several edges (their parts kept until summed)."""
        self.waiting = waiting
        self.summed = summed

    def _describe(self, g, role: str, slot):
        """(called under `own()`)"""
        if self.keep or g is None:
            return g
        return self.session.describe(g, self.record["name"], role, slot)

    def _failed(self, exc: Exception) -> None:
        self.session.failed(f"{self.record['name']} (backward)", exc, self.record)

    def boundary(self, positions: list, slots=()):
        """The post hook of a node handing gradients to the call's arguments."""
        def hook(grad_inputs, grad_outputs):
            if self.done:   # a second backward through a retained graph: recorded once
                return
            if not self.session.recording or capturing_graph():  # (see guards.py)
                self.done = True
                return
            try:
                with self.session.own():    # (a sum is a tensor op: opdiff's own)
                    for nr, j in slots:     # this node also made some of the op's outputs
                        self.grads_out[j] = self._describe(grad_outputs[nr], Role.INPUT, j)
                    grads_in, summed = self.grads_in, self.summed
                    for k, i in positions:
                        g = grad_inputs[k]
                        if g is None:
                            continue
                        if i not in summed:
                            grads_in[i] = self._describe(g, Role.OUTPUT, i)
                        else:
                            grads_in[i] = g if grads_in[i] is None else grads_in[i] + g
            except Exception as exc:
                self._failed(exc)
            self.waiting -= 1
            if self.waiting == 0:
                self.emit()
        return hook

    def output_node(self, slots: list):
        """The pre hook of a node that made some of the call's outputs (not a boundary node)."""
        def prehook(grad_outputs):
            if self.done or not self.session.recording:
                return
            try:
                with self.session.own():
                    for nr, j in slots:
                        self.grads_out[j] = self._describe(grad_outputs[nr], Role.INPUT, j)
            except Exception as exc:
                self._failed(exc)
        return prehook

    def gradients(self, role: str, last: bool):
        """A module call's gradient group (see `on_all_grads`): w.r.t. its outputs (`role`
        Role.INPUT) or its inputs (Role.OUTPUT); the `last` group to arrive emits the record."""
        key = "inputs" if role == Role.INPUT else "outputs"

        def arrived(grads):
            if capturing_graph():    # a backward captured into a CUDA graph: see guards.py
                self.done = True
                return
            s = self.session
            with s.own():
                try:
                    self.record[key] = s.describe_all(grads, self.record["name"], role)
                except Exception as exc:
                    s.failed(self.record["name"], exc, self.record)
            if last:
                self.emit()
        return arrived

    def emit(self) -> None:
        s, record = self.session, self.record
        if self.done or not s.recording:
            return
        self.done = True
        if capturing_graph():    # a backward captured into a CUDA graph: see guards.py
            return
        if self.checked:
            name = record["name"]
            grads_out, grads_in = self.grads_out, self.grads_in
            with s.own():
                try:    # (what `_describe` described on arrival is a dict already)
                    record["inputs"] = [g if type(g) is dict else s.describe(g, name, Role.INPUT, j)
                                        for j, g in enumerate(grads_out)]
                    record["outputs"] = [g if type(g) is dict else s.describe(g, name, Role.OUTPUT, i)
                                         for i, g in enumerate(grads_in)]
                except Exception as exc:
                    self._failed(exc)
        s.emit(record)
        if self.checked:
            s.check_overflow(record, self.grads_out, self.grads_in)
        self.grads_out = self.grads_in = []   # the node may outlive this backward


def grad_targets(values) -> list:
    """Where the gradients of the tensors in `values` that require grad arrive: (node, output_nr)
    for a tensor made by an op, the tensor itself for a leaf. Taken before an in-place module
    runs, this names the gradient of its input, not of what it wrote over it."""
    return [(t.grad_fn, t.output_nr) if t.grad_fn is not None else t
            for t in tensors_in(values) if t.requires_grad]


def on_all_grads(session, targets: list, fn) -> None:
    """Call `fn(grads)` once every target (see `grad_targets`) has its gradient, in each backward.

    What `torch.autograd.graph.register_multi_grad_hook(mode="all")` does, without its leak: its
    hooks hold the nodes they sit on, so every hooked graph stayed alive after the step (250 MB a
    step on the benchmark CNN). A one-target group needs no node at all. A larger one must ask
    the engine which of its nodes will run; it holds them until the session's step closes, which
    breaks the cycle. Hooks on leaf tensors live on the tensor, not on a graph: they are removed
    when the step closes, or every step would add one more.
    """
    def register(target, hook):
        if isinstance(target, torch.Tensor):
            session.at_close.append(target.register_hook(hook).remove)
        else:
            node, nr = target

            def prehook(grad_outputs):
                hook(grad_outputs[nr])
            node.register_prehook(prehook)

    if len(targets) == 1:
        def single(grad):
            fn([grad])
        register(targets[0], single)
        return
    group: dict = {"nodes": [torch.autograd.graph._get_grad_fn_or_grad_acc(t) if isinstance(t, torch.Tensor)
                       else t[0] for t in targets], "tasks": {}}
    session.at_close.append(lambda: group.update(nodes=None))
    lock = threading.Lock()

    def member(i):
        def hook(grad):
            task = torch._C._current_graph_task_id()
            with lock:
                entry = group["tasks"].get(task)
                if entry is None:
                    nodes = group["nodes"]
                    if nodes is None:  # the step that made this graph is closed
                        return
                    expected = sum(map(torch._C._will_engine_execute_node, nodes))
                    entry = group["tasks"][task] = [expected, [None] * len(targets)]
                entry[1][i] = grad
                entry[0] -= 1
                if entry[0] > 0:
                    return
                del group["tasks"][task]
            fn(entry[1])
        return hook

    for i, target in enumerate(targets):
        register(target, member(i))


def hook_module_backward(session, pending, in_targets: list, outputs) -> None:
    """Record the backward of the module call `pending` (its sink.PendingRecord:
    `{module}.backward.{index}`): grads w.r.t. its outputs, then w.r.t. its inputs (`in_targets`:
    `grad_targets` of its inputs, taken when the call began)."""
    out_targets = grad_targets(outputs)
    if not out_targets:
        return
    name = backward_name(session, pending, Kind.MODULE)
    if name is None:
        return
    record = BackwardRecord(session, pending, name)
    on_all_grads(session, out_targets, record.gradients(Role.INPUT, last=not in_targets))
    if in_targets:
        on_all_grads(session, in_targets, record.gradients(Role.OUTPUT, last=True))
