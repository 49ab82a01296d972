"""Which process group a recorded collective ran on, and its place in that group's sequence.

Every rank issues the collectives of one group in the same order, so the k-th collective of
group [0, 1] on rank 0 is the k-th on rank 1: `"group": {"ranks": [0, 1], "seq": k}` on a
record finds the same collective in every participating rank's dump (the comparison's cross-rank
analysis reads it). Point-to-point ops (send/recv, isend/irecv) are counted per pair of peers
and also carry the peer: `{"ranks": [0, 1], "seq": k, "peer": 1}`.

    collectives.annotate(pending, func, args, kwargs, session)    # capture/api.py, per Distributed op

The counter lives per sink (one per step and rank), and advances for collectives the selection
leaves out too, so numbering does not depend on what was recorded.

DDP's bucketed gradient all-reduce is issued by its C++ reducer inside backward, where no
TorchFunctionMode is active (the mode stack is empty in the reducer's hook) and where L1 records
no op call anyway. `PrecisionDebugger.start(model)` at L1/mix calls
`record_backward_collectives(model)`, which needs no opt-in: a DDP model without a comm hook
gets `record_ddp_allreduce`'s, `fully_shard` modules `record_fsdp_reduce_scatter`'s (a model with
its own keeps it, said once). `record_ddp_allreduce(ddp_model)` itself: it
registers a DDP comm hook doing what DDP's default does (divide by the group size, all_reduce),
issued through `dist.all_reduce` with the running capture's mode re-entered, so the bucket's
all_reduce becomes a `Distributed.all_reduce` record with its group and number like any other.
FSDP2's gradient reduce-scatter runs in its post-backward hooks, also with an empty mode stack
(letting `Distributed.*` through capture's in-backward skip records nothing: measured);
`record_fsdp_reduce_scatter(model)` opts in the same way, through `set_custom_reduce_scatter`.
Both rely on capture/api.py's side: the running ApiCapture registers itself here
(`entered`/`left`) and lets a collective through during backward when `in_comm_hook(op)`.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import weakref
from typing import Any, Callable, Iterator, Optional

from ..errors import ConfigError

log = logging.getLogger("opdiff")

_P2P_PEER = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}
_signatures: dict[Callable[..., Any], Optional[inspect.Signature]] = {}
_counters: "weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], int]]" = \
    weakref.WeakKeyDictionary()


def _signature(func: Callable[..., Any]) -> Optional[inspect.Signature]:
    if func not in _signatures:
        try:
            _signatures[func] = inspect.signature(func)
        except (TypeError, ValueError):
            _signatures[func] = None
    return _signatures[func]


def group_of(func: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Optional[tuple[list[int], Optional[int]]]:
    """(the global ranks of the call's process group, the peer of a point-to-point op), or None
    when torch.distributed is not initialised or the call names no group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    if getattr(func, "__module__", "") == _FUNCTIONAL:
        return _functional_group(func, args, kwargs)
    sig = _signature(func)
    if sig is None:
        return None
    try:
        bound = sig.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return None
    group = bound.get("group")
    if group is None:
        group = bound.get("process_group")
    try:
        ranks = sorted(dist.get_process_group_ranks(group or dist.group.WORLD))
    except Exception:  # noqa: BLE001 - a group torch cannot describe: not numbered
        return None
    peer_arg = _P2P_PEER.get(getattr(func, "__name__", ""))
    peer = bound.get(peer_arg) if peer_arg else None
    return ranks, (int(peer) if peer is not None else None)


# torch.distributed's functional collectives (torch.ops._c10d_functional.*: DTensor's
# redistribution, tensor parallelism's all_reduce) name their group by its registered name.
_FUNCTIONAL = "torch._ops._c10d_functional"


def _functional_group(func: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Optional[tuple[list[int], Optional[int]]]:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        names = [a.name for a in func.default._schema.arguments]
        at = names.index("group_name")
        group_name = args[at] if at < len(args) else kwargs["group_name"]
        return sorted(dist.get_process_group_ranks(_resolve_process_group(group_name))), None
    except Exception:  # noqa: BLE001 - a group torch cannot describe: not numbered
        return None


def waited(out: Any) -> Any:
    """A functional collective's result once it is there: `torch.ops._c10d_functional` ops
    return before the collective ends (the tensor is filled at `wait_tensor`), so capture waits
    before describing it. Waiting again later (DTensor does) is a no-op."""
    import torch

    try:
        return torch.ops._c10d_functional.wait_tensor(out)
    except Exception:  # noqa: BLE001 - not a collective's pending result: as it is
        return out


def annotate(pending: Any, func: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], session: Any) -> None:
    """Number this collective in its group's sequence (always) and, when it is recorded
    (`pending` not None), set `pending.record["group"]`. Never raises into the user's call."""
    try:
        found = group_of(func, args, kwargs)
        if found is None:
            return
        ranks, peer = found
        if peer is not None:
            import torch.distributed as dist

            me = dist.get_rank()
            key: tuple[Any, ...] = ("p2p", min(me, peer), max(me, peer))
        else:
            key = tuple(ranks)
        counters = _counters.setdefault(session, {})
        seq = counters.get(key, 0)
        counters[key] = seq + 1
        if pending is not None:
            group: dict[str, Any] = {"ranks": ranks, "seq": seq}
            if peer is not None:
                group["peer"] = peer
            pending.record["group"] = group
    except Exception:  # noqa: BLE001 - bookkeeping must not break the user's collective
        return


_active_modes: list[Any] = []        # the running capture modes, innermost last
_hook_state = threading.local()


def entered(mode: Any) -> None:
    """A capture mode started (capture/api.py): the comm hook re-enters the innermost one."""
    _active_modes.append(mode)


def left(mode: Any) -> None:
    """A capture mode stopped."""
    if mode in _active_modes:
        _active_modes.remove(mode)


def in_comm_hook(op: str) -> bool:
    """Whether `op` is a collective issued by `record_ddp_allreduce`'s hook or
    `record_fsdp_reduce_scatter`'s reduce-scatter: capture records it
    although autograd's engine is running a node."""
    return bool(getattr(_hook_state, "on", False)) and op.startswith("Distributed.")


@contextlib.contextmanager
def _recorded() -> Iterator[None]:
    """Run a collective issued inside backward under the innermost capture mode (autograd's
    engine runs hooks with an empty mode stack), marked so capture/api.py records it."""
    mode = _active_modes[-1] if _active_modes else None
    _hook_state.on = True
    try:
        with mode if mode is not None else contextlib.nullcontext():
            yield
    finally:
        _hook_state.on = False


def record_ddp_allreduce(ddp_model: Any, process_group: Any = None) -> None:
    """Opt in to recording DDP's gradient all-reduce (one `Distributed.all_reduce` record per
    bucket, with its group and per-group number) while opdiff captures at L1.

    Call it once after wrapping the model, before training: it registers a DDP comm hook
    (`register_comm_hook`) with DDP's default arithmetic (`allreduce_hook`: the bucket divided
    by the group size, then summed over the group), so training is unchanged; a model that has
    its own comm hook already cannot take a second one (DDP raises).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state: Any, bucket: Any) -> Any:
        with _recorded():
            return default_hooks.allreduce_hook(state, bucket)

    # DDP checks the hook's annotations as objects (this module's are strings).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    # DDP's own group (a data-parallel subgroup of a 2-D mesh): `allreduce_hook` with no state
    # would reduce over the whole world, mixing in the tensor-parallel peers' gradients.
    ddp_model.register_comm_hook(process_group or getattr(ddp_model, "process_group", None), hook)
    _auto_done.add(ddp_model)        # start(ddp_model) need not (and cannot) add it again


def record_fsdp_reduce_scatter(model: Any) -> int:
    """Opt in to recording FSDP2's gradient reduce-scatter (one `Distributed.reduce_scatter_tensor`
    (`reduce_scatter_single` in torch 2.13)
    record per FSDP parameter group and backward, with its group and per-group number) while
    opdiff captures at L1. Returns how many FSDP modules it was set on.

    Call it once after `fully_shard`, before training. FSDP2 reduce-scatters in its post-backward
    hooks, where no capture mode is active; this gives every `FSDPModule` under `model`
    (`set_custom_reduce_scatter`) a reduce-scatter doing what FSDP2's default does
    under the running capture. Its buffers are zero-filled, not
    `torch.empty`: the padding FSDP2 never writes and the output's old contents are then the same
    in every run, so they cannot differ between two dumps. A ConfigError when `model` holds no
    FSDP2 module, or when one already has a custom reduce-scatter.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ConfigError("record_fsdp_reduce_scatter: the model holds no FSDP2 module; call it "
                          "after fully_shard(...)")
    for module in modules:
        for group in module._get_fsdp_state()._fsdp_param_groups:
            if type(group._reduce_scatter_comm) is not DefaultReduceScatter:
                raise ConfigError(f"record_fsdp_reduce_scatter: {type(module).__name__} already has "
                                  f"a custom reduce-scatter ({type(group._reduce_scatter_comm).__name__})"
                                  f"; opdiff cannot record it without replacing it")
        module.set_custom_reduce_scatter(_recorded_reduce_scatter())
    return len(modules)


def _recorded_reduce_scatter() -> Any:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    # torch 2.13 names it reduce_scatter_single (reduce_scatter_tensor is deprecated there)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    class RecordedReduceScatter(ReduceScatter):
        """FSDP2's default reduce-scatter, issued under the running capture."""

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return torch.zeros(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            with _recorded():
                # positionally: capture finds a collective's output as its first argument
                return reduce_scatter(output_tensor, input_tensor, op=op, group=group,
                                      async_op=async_op)

    return RecordedReduceScatter()


_auto_done: "weakref.WeakSet[Any]" = weakref.WeakSet()
_auto_said: set[str] = set()


def _say_once(key: str, text: str) -> None:
    if key not in _auto_said:
        _auto_said.add(key)
        log.warning("opdiff: %s", text)


def record_backward_collectives(model: Any) -> None:
    """What `PrecisionDebugger.start(model)` calls at L1 and mix: DDP's gradient all-reduce and
    FSDP2's reduce-scatter recorded without an opt-in call. A DDP model without a comm hook
    gets `record_ddp_allreduce`'s; `fully_shard` modules with FSDP2's default reduce-scatter
    get `record_fsdp_reduce_scatter`'s. A model with its own comm hook or reduce-scatter keeps
    it, and says once that its collective is not recorded (the compare then infers it). Once per
    model; never raises."""
    try:
        if model is None or model in _auto_done:
            return
        _auto_done.add(model)
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            if getattr(model, "_comm_hooks", None):
                _say_once("ddp", "this DDP model has its own comm hook: its gradient all-reduce is "
                                 "not recorded (the compare infers it from the gradients)")
            else:
                record_ddp_allreduce(model)
            return
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:
            return
        fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if fsdp and all(type(g._reduce_scatter_comm).__name__ == "RecordedReduceScatter"
                        for m in fsdp for g in m._get_fsdp_state()._fsdp_param_groups):
            return                               # the user called record_fsdp_reduce_scatter
        if fsdp:
            try:
                record_fsdp_reduce_scatter(model)
            except ConfigError as exc:
                _say_once("fsdp", f"{exc} (the compare infers the reduce-scatter from the gradients)")
    except Exception as exc:  # noqa: BLE001 - recording collectives must not stop training
        _say_once("collectives", f"backward collectives are not recorded ({type(exc).__name__}: {exc})")


_dtensor_type: list[Any] = []


def _finished(t: Any) -> Any:
    """A functional collective's pending result (AsyncCollectiveTensor: TP's all-reduce, read
    through DTensor's views, or a DTensor's local tensor) as the plain tensor it holds once the
    collective has finished (its wrapper has no memory of its own to save); `t` otherwise."""
    if callable(getattr(t, "_get_acs_underlying_tensor", None)):
        try:
            return t.trigger_wait()
        except Exception:  # noqa: BLE001 - described as it is
            return t
    return t


def local_shard(t: Any) -> tuple[Any, Optional[dict[str, Any]]]:
    """(this rank's shard of a DTensor, where it sits), or (t, None) for any other tensor.

    capture/describe.py describes a DTensor by its local shard: its statistics are this rank's
    elements only (reducing the DTensor itself would run DTensor ops, collectives included, and
    cannot mix with plain tensors), and `placement` says which part of the global tensor they
    are: `{"placements": ["Shard(dim=0)"], "coordinate": [1], "global_shape": [16, 8],
    "whole": false}` (`whole`: the shard holds every value of the global tensor as it is).
    Golden's rank r is compared with the target's rank r, so the shards match when both runs
    use the same mesh and placements (the placement is in the record to check it).
    """
    if not _dtensor_type:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:          # torch built without distributed
            DTensor = ()             # type: ignore[assignment,misc]  # noqa: N806
        _dtensor_type.append(DTensor)
    if not isinstance(t, _dtensor_type[0]):
        return _finished(t), None
    try:
        coordinate = t.device_mesh.get_coordinate()
        local = _finished(t._local_tensor)
        placed = {"placements": [str(p) for p in t.placements],
                  "coordinate": list(coordinate) if coordinate is not None else None,
                  "global_shape": list(t.shape),
                  # every value of the global tensor, as it is: no slice, no partial sum
                  "whole": (list(local.shape) == list(t.shape)
                            and not any(p.is_partial() for p in t.placements))}
        return local, placed
    except Exception:  # noqa: BLE001 - a DTensor we cannot read: described as it is
        return t, None


def parallel_facts(model: Any = None) -> Optional[dict[str, Any]]:
    """What meta.json says of how this run is laid out over ranks (`"parallel"`), or None when
    torch.distributed is not initialised: `{"world_size": 2, "rank": 1, "styles": {"0":
    {"style": "ColwiseParallel", "input": ["R"], "output": ["S(-1)"]}}, "tp_plan": {...}}`.

    `styles`: the modules torch's tensor parallelism (`parallelize_module`) hooked, read off
    their hooks; `tp_plan`: Hugging Face's `_tp_plan` where the model has one. Cheap: one walk
    over the model's modules per step, no tensor touched. The comparison merges a run laid out
    over several ranks into one logical run (comparison/layouts); these facts say, in words,
    what it was merged from. Never raises."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        facts: dict[str, Any] = {"world_size": dist.get_world_size(), "rank": dist.get_rank()}
        if model is None:
            return facts
        styles = {}
        for fqn, module in model.named_modules():
            style = _style_of(module)
            if style is not None:
                styles[fqn] = style
        if styles:
            facts["styles"] = styles
        plan = getattr(model, "_tp_plan", None) or getattr(model, "tp_plan", None)
        if isinstance(plan, dict) and plan:
            facts["tp_plan"] = {str(k): str(v) for k, v in plan.items()}
        return facts
    except Exception:  # noqa: BLE001 - facts for people: never break the run
        return None


def _style_of(module: Any) -> Optional[dict[str, Any]]:
    """The tensor-parallel style (ColwiseParallel, RowwiseParallel, SequenceParallel, ...)
    whose hooks `distribute_module` put on `module`: its hooks' closures hold the style's
    `_prepare_input_fn` / `_prepare_output_fn` as a partial over its layouts."""
    out: dict[str, Any] = {}
    for key, hooks in (("input", getattr(module, "_forward_pre_hooks", {})),
                       ("output", getattr(module, "_forward_hooks", {}))):
        for hook in hooks.values():
            for cell in getattr(hook, "__closure__", None) or ():
                try:
                    fn = cell.cell_contents
                except ValueError:
                    continue
                func = getattr(fn, "func", None)
                if not getattr(func, "__module__", "").startswith("torch.distributed.tensor.parallel"):
                    continue
                out["style"] = getattr(func, "__qualname__", "").split(".")[0]
                args = getattr(fn, "args", ())
                if args:
                    seq = args[0] if isinstance(args[0], (list, tuple)) else (args[0],)
                    out[key] = [str(x) for x in seq]
    return out or None

__all__ = ["local_shard", "parallel_facts", "waited", "annotate", "group_of", "record_ddp_allreduce",
           "record_fsdp_reduce_scatter",
           "record_backward_collectives",
           "in_comm_hook", "entered", "left"]
