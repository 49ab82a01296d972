"""Backward capture without full backward hooks (in-place safe, compile friendly).

For an op whose outputs require grad, the autograd node that produced them gets a hook
`node.register_hook(fn(grad_inputs, grad_outputs))`: grad_outputs are the gradients w.r.t. the
op's outputs (the backward record's inputs), grad_inputs the gradients w.r.t. its inputs (the
backward record's outputs). For an API that builds several autograd nodes (a composite op), the
hook sits on the last node, as msprobe's does. Modules use tensor hooks on their outputs plus
`register_multi_grad_hook` on their inputs, which gives the total gradient of each input.
"""
from __future__ import annotations

import torch

from .describe import tensors_in


def grad_nodes(outputs) -> list:
    """Distinct autograd nodes of the output tensors that require grad."""
    nodes = []
    for t in tensors_in(outputs):
        fn = t.grad_fn if t.requires_grad else None
        if fn is not None and all(fn is not n for n in nodes):
            nodes.append(fn)
    return nodes


def in_backward() -> bool:
    """True while autograd's engine runs a node (e.g. checkpoint recomputation)."""
    return torch._C._current_autograd_node() is not None


def hook_api_backward(session, fwd_name: str, op: str, index: int, module, stack, outputs) -> None:
    """Arrange for `{op}.{index}.backward` to be recorded when autograd reaches this op."""
    nodes = grad_nodes(outputs)
    if not nodes:
        return
    name = f"{op}.{index}.backward"
    if not session.selected(name):
        return

    def on_node(grad_inputs, grad_outputs):
        if session.writer is None:
            return
        record = {"name": name, "op": op, "kind": "api", "phase": "backward", "module": module,
                  "forward": fwd_name, "stack": stack}
        with session.internal():
            try:
                record["inputs"] = session.describe_all(grad_outputs, name, "input")
                record["outputs"] = session.describe_all(grad_inputs, name, "output")
            except Exception as exc:
                session.failed(f"{name} (backward)", exc, record)
        session.emit(record)
        session.check_overflow(record, grad_outputs, grad_inputs)

    # One node covers every output that shares it (multi-output ops); with several distinct
    # nodes, the first one that is reached carries the record.
    nodes[0].register_hook(on_node)


def hook_module_backward(session, fwd_name: str, op: str, index: int, parent, stack, inputs, outputs):
    """Record `{module}.backward.{index}`: grads w.r.t. its outputs, then w.r.t. its inputs."""
    out_tensors = [t for t in tensors_in(outputs) if t.requires_grad]
    if not out_tensors:
        return
    name = f"{op}.backward.{index}"
    if not session.selected(name):
        return
    in_tensors = [t for t in tensors_in(inputs) if t.requires_grad]
    record = {"name": name, "op": op, "kind": "module", "phase": "backward", "module": parent,
              "forward": fwd_name, "stack": stack, "inputs": [], "outputs": []}
    state = {"emitted": False}

    def emit():
        if not state["emitted"] and session.writer is not None:
            state["emitted"] = True
            session.emit(record)

    def on_outputs(grads):
        with session.internal():
            try:
                record["inputs"] = session.describe_all(grads, name, "input")
            except Exception as exc:
                session.failed(f"{name}", exc, record)
        if not in_tensors:
            emit()

    def on_inputs(grads):
        with session.internal():
            try:
                record["outputs"] = session.describe_all(grads, name, "output")
            except Exception as exc:
                session.failed(f"{name}", exc, record)
        emit()

    torch.autograd.graph.register_multi_grad_hook(out_tensors, on_outputs, mode="all")
    if in_tensors:
        torch.autograd.graph.register_multi_grad_hook(in_tensors, on_inputs, mode="all")
