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

import torch

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


def hook_api_backward(session, fwd_name: str, op: str, index: int, module, stack, outputs,
                      edges=(), first_seq: int | None = None) -> None:
    """Arrange for `{op}.{index}.backward` to be recorded when autograd reaches this op.

    Inputs of the record: the gradient w.r.t. every output tensor (None where none flowed).
    Outputs: the gradient this call sends to each of its tensor arguments, summed over the
    edges of the nodes it created (a composite op such as F.linear on 3-D input builds several).
    """
    out_tensors = [outputs] if isinstance(outputs, torch.Tensor) else list(tensors_in(outputs))
    if not any(t.requires_grad for t in out_tensors):
        return
    name = record_name(op, Phase.BACKWARD, index)
    if not session.selected(name, forward_selected=True):
        return
    last_seq = torch._C._autograd._get_sequence_nr()
    first = first_seq if first_seq is not None else last_seq - 1
    roots = [fn for fn in grad_nodes(out_tensors) if first <= fn._sequence_nr() < last_seq]
    if not roots:
        return
    nodes, leaving = op_nodes(roots, first, last_seq)
    node_ids = {id(n) for n in nodes}
    targets = {(id(fn), nr): i for i, fn, nr, _ in edges if fn is not None}
    leaves = {id(t): i for i, fn, _, t in edges if fn is None}
    n_inputs = 1 + max((i for i, _, _, _ in edges), default=-1)
    # Boundary edges: from a node of this call to the node that owns one of its arguments' grads.
    boundary: dict = {}
    for node, k, nxt, nr in leaving:
        i = targets.get((id(nxt), nr))
        if i is None and leaves and type(nxt).__name__ == "AccumulateGrad":
            i = leaves.get(id(nxt.variable))
        if i is not None:
            boundary.setdefault(id(node), (node, []))[1].append((k, i))
    record = {"name": name, "op": op, "kind": Kind.API, "phase": Phase.BACKWARD, "module": module,
              "forward": fwd_name, "stack": stack,
              "inputs": [None] * len(out_tensors), "outputs": [None] * n_inputs}
    state = {"waiting": len(boundary), "grads_out": [None] * len(out_tensors),
             "grads_in": [None] * n_inputs, "done": False}

    def emit():
        if state["done"] or session.writer is None:
            return
        state["done"] = True
        if capturing_graph():    # a backward captured into a CUDA graph: see guards.py
            return
        with session.own():
            try:
                record["inputs"] = session.describe_all(state["grads_out"], name, Role.INPUT)
                record["outputs"] = session.describe_all(state["grads_in"], name, Role.OUTPUT)
            except Exception as exc:
                session.failed(f"{name} (backward)", exc, record)
        session.emit(record)
        session.check_overflow(record, state["grads_out"], state["grads_in"])
        state["grads_out"] = state["grads_in"] = None   # the node may outlive this backward

    def on_boundary(positions, slots=()):
        def hook(grad_inputs, grad_outputs):
            if state["done"]:   # a second backward through a retained graph: recorded once
                return
            for nr, j in slots:     # this node also made some of the op's outputs
                state["grads_out"][j] = grad_outputs[nr]
            try:
                with session.own():
                    for k, i in positions:
                        g = grad_inputs[k]
                        if g is not None:
                            prev = state["grads_in"][i]
                            state["grads_in"][i] = g if prev is None else prev + g
            except Exception as exc:
                session.failed(f"{name} (backward)", exc, record)
            state["waiting"] -= 1
            if state["waiting"] == 0:
                emit()
        return hook

    # Gradients w.r.t. the outputs: what each output's node receives (a node pre-hook sees the
    # gradient of the value the op produced, even if the tensor was later changed in place).
    by_node: dict = {}
    for j, t in enumerate(out_tensors):
        if t.requires_grad and t.grad_fn is not None and id(t.grad_fn) in node_ids:
            by_node.setdefault(id(t.grad_fn), (t.grad_fn, []))[1].append((t.output_nr, j))

    def on_output_node(slots):
        def prehook(grad_outputs):
            if state["done"]:
                return
            for nr, j in slots:
                state["grads_out"][j] = grad_outputs[nr]
        return prehook

    # A node with a post hook anyway sees the same gradients there (usually the op's only node).
    for key, (node, positions) in boundary.items():
        node.register_hook(on_boundary(positions, by_node.pop(key, (None, ()))[1]))
    for node, slots in by_node.values():
        node.register_prehook(on_output_node(slots))
    if not boundary:  # no argument needs a gradient (e.g. a factory with requires_grad=True)
        nodes[0].register_hook(lambda grad_inputs, grad_outputs: emit())


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


def hook_module_backward(session, fwd_name: str, op: str, index: int, parent, stack, in_targets: list,
                         outputs):
    """Record `{module}.backward.{index}`: grads w.r.t. its outputs, then w.r.t. its inputs
    (`in_targets`: `grad_targets` of its inputs, taken when the call began)."""
    out_targets = grad_targets(outputs)
    if not out_targets:
        return
    name = record_name(op, Phase.BACKWARD, index, Kind.MODULE)
    if not session.selected(name, forward_selected=True):
        return
    has_inputs = bool(in_targets)
    record = {"name": name, "op": op, "kind": Kind.MODULE, "phase": Phase.BACKWARD, "module": parent,
              "forward": fwd_name, "stack": stack, "inputs": [], "outputs": []}
    state = {"emitted": False}

    def emit():
        if not state["emitted"] and session.writer is not None:
            state["emitted"] = True
            session.emit(record)

    def on_outputs(grads):
        if capturing_graph():    # a backward captured into a CUDA graph: see guards.py
            state["emitted"] = True
            return
        with session.own():
            try:
                record["inputs"] = session.describe_all(grads, name, Role.INPUT)
            except Exception as exc:
                session.failed(f"{name}", exc, record)
        if not has_inputs:
            emit()

    def on_inputs(grads):
        if capturing_graph():
            state["emitted"] = True
            return
        with session.own():
            try:
                record["outputs"] = session.describe_all(grads, name, Role.OUTPUT)
            except Exception as exc:
                session.failed(f"{name}", exc, record)
        emit()

    on_all_grads(session, out_targets, on_outputs)
    if in_targets:
        on_all_grads(session, in_targets, on_inputs)
