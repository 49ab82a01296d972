"""L0: every nn.Module call of the given model(s), through the global module hooks.

A forward pre-hook describes the inputs before the module runs (an in-place module such as
ReLU(inplace=True) overwrites them); the forward hook describes outputs and parameters. Modules
are held through weak references, and every hook handle is removed by `remove()`.
"""
from __future__ import annotations

import weakref

import torch
from torch.nn.modules import module as nn_module

from .backward import grad_targets, hook_module_backward, in_backward
from .guards import capturing_graph, tracing_or_capturing


def module_names(models) -> dict:
    """{id(module): (weakref, "Module.<path>.<Class>")} for every module under the model(s).

    The root is left out when it has children (msprobe does the same); with several models, a
    `<i>.` prefix keeps their paths apart.
    """
    names = {}
    models = list(models) if isinstance(models, (list, tuple)) else [models]
    for i, model in enumerate(models):
        prefix = f"{i}." if len(models) > 1 else ""
        has_children = any(True for _ in model.children())
        for path, mod in model.named_modules():
            if not path and has_children:
                continue
            path = prefix + path if path else prefix.rstrip(".")
            label = f"Module.{path}.{type(mod).__name__}" if path else f"Module.{type(mod).__name__}"
            names[id(mod)] = (weakref.ref(mod), label)
    return names


class ModuleCapture:
    """Installs global forward hooks filtered to one model's modules, plus parameter-grad hooks."""

    def __init__(self, session, models):
        self.session = session
        self.names = module_names(models)
        self.handles = []
        self.param_handles = []
        models = list(models) if isinstance(models, (list, tuple)) else [models]
        self.models = [weakref.ref(m) for m in models]

    def install(self, param_grads: bool = True) -> None:
        self.handles.append(nn_module.register_module_forward_pre_hook(self._pre))
        # always_call: a forward that raises must still pop its call, or every later op is
        # attributed to the dead call.
        # with_kwargs: `model(input_ids=..., attention_mask=...)` passes its tensors by keyword
        # (the global pre-hook cannot see them; they are described when the call returns).
        self.handles.append(nn_module.register_module_forward_hook(self._post, always_call=True,
                                                                   with_kwargs=True))
        if param_grads and self.session.want_backward and not self.param_handles:
            self._hook_params()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
            # torch's handle forgets the with_kwargs registry of global hooks (torch 2.13):
            # left there, every later torch.compile(module) warns about global hooks.
            getattr(nn_module, "_global_forward_hooks_with_kwargs", {}).pop(h.id, None)
        self.handles.clear()

    def remove_param_hooks(self) -> None:
        for h in self.param_handles:
            h.remove()
        self.param_handles.clear()

    def _label(self, module):
        entry = self.names.get(id(module))
        if entry is None or entry[0]() is not module:
            return None
        return entry[1]

    def _hook_params(self) -> None:
        s = self.session
        for ref, label in list(self.names.values()):
            mod = ref()
            if mod is None:
                continue
            params = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad]
            for pname, p in params:
                def on_grad(param, label=label, pname=pname, expected=len(params)):
                    if s.writer is not None and param.grad is not None and not capturing_graph():
                        try:
                            s.add_param_grad(label, expected, pname, param.grad)
                        except Exception as exc:
                            s.failed(f"{label}.parameters_grad", exc)
                self.param_handles.append(p.register_post_accumulate_grad_hook(on_grad))

    def _stack(self):
        st = getattr(self.session.local, "module_calls", None)
        if st is None:
            st = self.session.local.module_calls = []
            self.session.local.modules = []
        return st

    def _pre(self, module, args):
        if tracing_or_capturing():
            return None   # see api.py
        s = self.session
        label = self._label(module)
        if label is None or s.busy or s.writer is None or in_backward():
            return None
        calls = self._stack()
        record = None
        targets = None
        try:
            index = s.next_index(f"{label}.forward")
            name = f"{label}.forward.{index}"
            parent = s.local.modules[-1] if s.local.modules else None
            if s.selected(name):
                record = {"name": name, "op": label, "kind": "module", "phase": "forward",
                          "module": parent, "stack": s.stack_id(skip=3), "_index": index}
                backward = s.want_backward and torch.is_grad_enabled()
                with s.internal():
                    record["inputs"] = s.describe_all(args, name, "input")
                    if backward:
                        # before the call: an in-place module moves its input onto its own node
                        targets = grad_targets(args)
        except Exception as exc:
            if record is not None:   # inputs could not be described: keep the call, say why
                record.setdefault("inputs", [])
            else:
                name = label
            s.failed(label, exc, record)
        calls.append((module, record, args, targets))
        s.local.modules.append(name)
        return None

    def _post(self, module, args, *rest):
        # (kwargs, output) normally; torch calls an always_call hook with (args, output) alone
        # when the forward raised.
        kwargs, output = rest if len(rest) == 2 else ({}, rest[0])
        if tracing_or_capturing():
            return None   # see api.py
        s = self.session
        calls = getattr(s.local, "module_calls", None)
        if not calls or calls[-1][0] is not module:
            return None
        _, record, pre_args, in_targets = calls.pop()
        s.local.modules.pop()
        if record is None or s.writer is None:
            return None
        s.module_returned(record["name"])
        try:
            index = record.pop("_index")
            backward = in_targets is not None and torch.is_grad_enabled()   # (internal() disables grad)
            with s.internal():
                if kwargs:
                    record["kwargs"] = {k: s.describer.describe(v, f"{record['name']}.input.{k}")
                                        for k, v in kwargs.items()}
                record["outputs"] = s.describe_all(
                    output if isinstance(output, (tuple, list)) else [output], record["name"], "output")
                record["parameters"] = {
                    n: s.describer.describe(p, f"{record['name']}.parameters.{n}")
                    for n, p in module._parameters.items() if p is not None}
                if s.want_forward:
                    s.emit(record)
                s.check_overflow(record, pre_args, output)
                if backward:
                    if kwargs:
                        in_targets = in_targets + grad_targets(kwargs)
                    hook_module_backward(s, record["name"], record["op"], index, record["module"],
                                         record["stack"], in_targets, output)
        except Exception as exc:
            s.failed(record.get("name", "module"), exc, record)
        return None
