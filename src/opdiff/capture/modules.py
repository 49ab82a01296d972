"""L0: every nn.Module call of the given model(s), through the global module hooks.

A forward pre-hook describes the inputs before the module runs (an in-place module such as
ReLU(inplace=True) overwrites them); the forward hook describes outputs and parameters. Modules
are held through weak references, and every hook handle is removed by `remove()`.

The two global hooks stay registered from the first `start()` until the model (or the debugger)
is gone, switched on and off by `start()`/`stop()`: dynamo guards on the global hook registry,
so registering them again at each step would recompile every `torch.compile`d frame at every
recorded step. Traced by dynamo they are no-ops (`guards.never_compiled`).
"""
from __future__ import annotations

import sys
import weakref

import torch
from torch.nn.modules import module as nn_module
from torch.nn.parameter import UninitializedParameter

from ..store.schema import Kind, Phase, Role, module_op, record_name
from . import guards, stacks
from .backward import grad_targets, hook_module_backward, in_backward
from .guards import capturing_graph, never_compiled, tracing_or_capturing
from .leaves import tag_leaves


def module_names(models) -> dict:
    """{id(module): (weakref, "Module.<path>.<Class>")} for every module under the model(s).

    The root is left out when it has children (msprobe does the same); with several models, a
    `<i>.` prefix keeps their paths apart.
    """
    names = {}
    models = _as_list(models)
    for i, model in enumerate(models):
        prefix = f"{i}." if len(models) > 1 else ""
        has_children = any(True for _ in model.children())
        for path, mod in model.named_modules():
            if not path and has_children:
                continue
            path = prefix + path if path else prefix.rstrip(".")
            names[id(mod)] = (weakref.ref(mod), module_op(path, type(mod).__name__))
    return names


def _as_list(models) -> list:
    return list(models) if isinstance(models, (list, tuple)) else [models]


def _call_frame(f):
    """The frame that called the global pre-hook: torch's, which runs the module's forward and
    stays on the stack until it returns (the hook's own wrappers, `pre` and guards'
    `outside_compile`, have returned by then, and a walk from an op inside would never meet
    them)."""
    while f is not None and f.f_code.co_filename in _HOOK_FILES:
        f = f.f_back
    return f


_HOOK_FILES = frozenset((__file__, guards.__file__))
_deferred: list = []     # hooks whose removal came while dynamo compiled (see _remove)


def _compiling() -> bool:
    """Whether dynamo is compiling a frame now (its guards on the global hooks are not built
    yet)."""
    guards = sys.modules.get("torch._guards")
    return guards is not None and guards.CompileContext.try_get() is not None


def _remove(handles: list) -> None:
    """Remove global hooks (and empty `handles`).

    Not while dynamo compiles: a finalizer (the debugger or the model collected) may run
    in the middle of a compile that traced these hooks, and dynamo would then fail building
    its guard on them (KeyError). They are removed at the next call made outside a compile
    (their capture is gone: until then they do nothing)."""
    if _compiling():
        _deferred.extend(handles)
        handles.clear()
        return
    every = handles + _deferred
    _deferred.clear()
    handles.clear()
    for h in every:
        h.remove()
        # torch's handle forgets the with_kwargs registry of global hooks (torch 2.13):
        # left there, every later torch.compile(module) warns about global hooks.
        getattr(nn_module, "_global_forward_hooks_with_kwargs", {}).pop(h.id, None)


def _let_go_of_deferred() -> None:
    if _deferred and not _compiling():
        _remove([])


class ModuleCapture:
    """Installs global forward hooks filtered to one model's modules, plus parameter-grad hooks."""

    needs_model = True

    def __init__(self, session, models=None):
        self.session = session
        self.names: dict = {}
        self.handles: list = []
        self.param_handles: list = []
        self.models: list = []       # weak references: capture never keeps a model alive
        self.active = False          # the global hooks record (between start and stop)
        self._finalizers: list = []  # remove the hooks when the model or this object goes
        if models is not None:
            self._follow(models)

    def _follow(self, models) -> None:
        self.names = module_names(models)
        self.models = [weakref.ref(m) for m in _as_list(models)]
        for m in _as_list(models):   # the hooks go with the model
            self._finalizers.append(weakref.finalize(m, _remove, self.handles))

    def follows(self, models) -> bool:
        """Whether these are the model(s) whose modules are hooked."""
        models = _as_list(models)
        return len(models) == len(self.models) and all(r() is m for r, m in zip(self.models, models))

    # the layer's lifecycle (see debugger.LEVELS)
    def start(self, model) -> None:
        """Hook `model`'s modules (a new model: the previous one's hooks go)."""
        if not self.follows(model):
            self.remove()
            self.remove_param_hooks()
            self._follow(model)
        self.active = True
        self.install()

    def stop(self) -> None:
        self.active = False     # the global hooks stay (see the module docstring)

    def end_step(self) -> None:
        self.remove_param_hooks()

    def install(self, param_grads: bool = True) -> None:
        if not self.handles:
            # the hooks hold this object weakly: when the debugger goes, they go (finalize)
            me = weakref.ref(self)

            def pre(module, args):
                capture = me()
                if capture is None:     # a hook left behind (see _remove)
                    _let_go_of_deferred()
                    return None
                return capture._pre(module, args)

            def post(module, args, *rest):
                capture = me()
                return None if capture is None else capture._post(module, args, *rest)

            self.handles.append(nn_module.register_module_forward_pre_hook(never_compiled(pre)))
            # always_call: a forward that raises must still pop its call, or every later op is
            # attributed to the dead call.
            # with_kwargs: `model(input_ids=..., attention_mask=...)` passes its tensors by
            # keyword (the global pre-hook cannot see them; they are described when the call
            # returns).
            self.handles.append(nn_module.register_module_forward_hook(
                never_compiled(post), always_call=True, with_kwargs=True))
            self._finalizers.append(weakref.finalize(self, _remove, self.handles))
        if param_grads and self.session.selection.want_backward and not self.param_handles:
            self._hook_params()

    def remove(self) -> None:
        _remove(self.handles)
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()

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
        for ref, label in list(self.names.values()):
            mod = ref()
            if mod is None:
                continue
            # (what named_parameters(recurse=False) yields, without its generators: this runs
            # for every module at every start)
            params, seen = [], set()
            for n, p in mod._parameters.items():
                if p is not None and p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append((n, p))
            if any(isinstance(p, UninitializedParameter) for _, p in params):
                # A lazy module (nn.LazyLinear) takes hooks only once its first forward has
                # materialised its parameters (the same objects, their class changed).
                self._hook_when_materialised(mod, label, params)
                continue
            self._hook_param_grads(label, params)

    def _hook_param_grads(self, label, params) -> None:
        s = self.session
        for pname, p in params:
            def on_grad(param, label=label, pname=pname, expected=len(params)):
                if s.recording and param.grad is not None and not capturing_graph():
                    try:
                        s.add_param_grad(label, expected, pname, param.grad)
                    except Exception as exc:
                        s.failed(f"{label}.parameters_grad", exc)
            self.param_handles.append(p.register_post_accumulate_grad_hook(on_grad))

    def _hook_when_materialised(self, mod, label, params) -> None:
        me = weakref.ref(self)
        handle = None

        def materialised(module, args, output):
            capture = me()
            if any(isinstance(p, UninitializedParameter) for _, p in params):
                return None                     # still lazy (a forward that raised): wait
            handle.remove()
            if capture is not None:
                capture._hook_param_grads(label, params)
            return None

        handle = mod.register_forward_hook(materialised)
        self.param_handles.append(handle)

    def _pre(self, module, args):
        if tracing_or_capturing() or not self.active:
            return None   # see api.py
        s = self.session
        label = self._label(module)
        if label is None or s.own.active or not s.recording or in_backward():
            return None
        pending = None
        anchor = None
        try:
            index = s.next_index(f"{label}.forward")
            name = record_name(label, Phase.FORWARD, index, Kind.MODULE)
            if s.selection.selected(name):
                # The frame running this call (it stays on the stack until the call returns)
                # and the user frames from it outward: what every op inside it shares.
                caller = _call_frame(sys._getframe(1))
                anchor = (caller, stacks.frames_from(caller, anchor=s.modules.anchor))
                pending = s.begin(name, label, Kind.MODULE, Phase.FORWARD, index,
                                  s.stack_id(frames=anchor[1]))
                record = pending.record
                backward = s.selection.want_backward and torch.is_grad_enabled()
                with s.own():
                    if not s.ops_advance_epoch:    # L0: user code may have run since the last call
                        s.new_epoch()
                    record["inputs"] = s.describe_all(args, name, Role.INPUT)
                    if s.selection.opened == name:     # (a scope opens at this call)
                        s.leaves.scope_inputs(label, args)
                    tag_leaves(s, zip(args, record["inputs"]), record)
                    if backward:
                        # before the call: an in-place module moves its input onto its own node
                        pending.edges = grad_targets(args)
        except Exception as exc:   # inputs could not be described: keep the call, say why
            if pending is not None:
                pending.record.setdefault("inputs", [])
            else:
                name = label
            s.fail(pending, exc, label)
        s.modules.push(module, name, (pending, args), anchor)
        return None

    def _post(self, module, args, *rest):
        # (kwargs, output) normally; torch calls an always_call hook with (args, output) alone
        # when the forward raised.
        kwargs, output = rest if len(rest) == 2 else ({}, rest[0])
        if tracing_or_capturing() or not self.active:
            return None   # see api.py
        s = self.session
        state = s.modules.pop(module)
        if state is None:
            return None
        pending, pre_args = state
        if pending is None or not s.recording:
            return None
        s.selection.module_returned(pending.record["name"])
        in_targets = pending.edges
        backward = in_targets is not None and torch.is_grad_enabled()
        s.finish(pending, output, pre_args, kwargs=kwargs, parameters=module._parameters,
                 emit=s.selection.want_forward)
        if backward:
            try:
                if kwargs:
                    in_targets = in_targets + grad_targets(kwargs)
                with s.own():
                    hook_module_backward(s, pending, in_targets, output)
            except Exception as exc:
                s.fail(pending, exc)
        return None
