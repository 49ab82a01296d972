"""What opdiff knows about ops: one registry of traits, asked by capture, comparison, replay
and overflow alike.

An op is named as dumps name it (`Tensor.bernoulli_`, `Functional.dropout`, `Aten.add.Tensor`,
`Distributed.all_reduce`). Traits are registered for a whole name, for a method name (the last
part: `bernoulli_` covers `Tensor.bernoulli_` and `Aten.bernoulli_`), or for a name prefix
(`Distributed.`), in the spirit of `torch.utils.flop_counter.register_flop_formula`:

    from opdiff import ops
    ops.traits("Tensor.fill_").overwrites_first          # True
    ops.register("mylib.fused_gelu", cpu_reference=lambda x: torch.nn.functional.gelu(x))
    ops.register_method("my_random_fill_", random=True, overwrites_first=True)

A user registers a CPU reference for a custom op (`cpu_reference`), so that replay and
`opdiff check` can judge it; nothing else needs to change.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable, Optional


@dataclass(frozen=True)
class OpTraits:
    """Facts about one op. Every field defaults to "nothing special"."""
    skip: bool = False                # metadata or autograd plumbing: never recorded
    mutates: bool = False             # may write into a tensor it was given
    overwrites_first: bool = False    # writes its first argument without reading it (fill_, copy_)
    uninitialized: bool = False       # returns uninitialised memory (torch.empty and kin)
    random: bool = False              # draws from a random generator
    collective: bool = False          # a torch.distributed collective: depends on other ranks
    loss_scaler: bool = False         # GradScaler's own bookkeeping (unscale, update scale)
    returns_first_argument: bool = False   # returns None, its result is its first argument
    not_replayable: str = ""          # why replay cannot rebuild it ("" = it can be tried)
    cpu_reference: Optional[Callable] = None   # a CPU implementation for a custom op
    # Every output value is one of its floating inputs' values or 0 (relu, a reshape): its
    # result in the inputs' own dtype is its float64 result, forward and backward.
    exact_in_dtype: bool = False
    # Its gradients are the output gradient itself when every tensor has one shape and no
    # alpha is given (an addition): exact backward, not forward.
    exact_backward: bool = False

    @property
    def replay_refusal(self) -> str:
        """Why replay must not re-run this op, or ""."""
        if self.not_replayable:
            return self.not_replayable
        if self.collective:
            return "a collective: its result depends on the other ranks"
        if self.uninitialized:
            return "returns uninitialised memory"
        return ""


_BY_NAME: dict[str, OpTraits] = {}
_BY_METHOD: dict[str, OpTraits] = {}
_BY_PREFIX: dict[str, OpTraits] = {}


def _merge(table: dict, key: str, fields: dict) -> None:
    table[key] = replace(table.get(key, OpTraits()), **fields)
    traits.cache_clear()


def register(*names: str, **fields) -> None:
    """Set traits for whole op names (`Tensor.__setitem__`, `mylib.fused_gelu`)."""
    for name in names:
        _merge(_BY_NAME, name, fields)


def register_method(*methods: str, **fields) -> None:
    """Set traits for a method name in every namespace (`bernoulli_`: Tensor., Aten., Torch.)."""
    for method in methods:
        _merge(_BY_METHOD, method, fields)


def register_prefix(*prefixes: str, **fields) -> None:
    """Set traits for every op whose name starts with a prefix (`Distributed.`)."""
    for prefix in prefixes:
        _merge(_BY_PREFIX, prefix, fields)


def method_of(op: str) -> str:
    """The last part of an op name: `Tensor.bernoulli_` -> `bernoulli_`. Aten names carry an
    overload (`Aten.add.Tensor`, `Aten.bernoulli_.float`): its packet name is the method."""
    if op.startswith("Aten."):
        return op.split(".")[1] if op.count(".") >= 1 else op
    return op.rsplit(".", 1)[-1]


@functools.lru_cache(maxsize=4096)
def traits(op: str) -> OpTraits:
    """The traits of an op name (whole name, then method, then prefix; the first that knows)."""
    found = _BY_NAME.get(op)
    if found is not None:
        return found
    method = method_of(op)
    if op.startswith("Aten.") and op.count(".") >= 2:
        found = _BY_METHOD.get(op.split(".", 1)[1])   # `Aten.add.Tensor` registered as "add.Tensor"
        if found is not None:
            return found
    found = _BY_METHOD.get(method)
    if found is not None:
        return found
    for prefix, t in _BY_PREFIX.items():
        if op.startswith(prefix):
            return t
    return _PLAIN


_PLAIN = OpTraits()


def is_mutating(op: str, kwargs: dict) -> bool:
    """Whether a call may write into a tensor it was given: in-place methods (`add_`,
    `__iadd__`, `__setitem__`), collectives, `out=` and `inplace=True`."""
    method = method_of(op)
    return (method.endswith("_") and not method.endswith("__")) or method.startswith("__i") \
        or traits(op).mutates or kwargs.get("out") is not None or kwargs.get("inplace") is True


# -- what opdiff itself knows ------------------------------------------------------------------

# Calls that read metadata or manage autograd: never numerics, and most of the traffic
# TorchFunctionMode sees (checked on the function's __name__, before a name is built).
SKIPPED_FUNCTIONS = frozenset({
    "__get__", "__set__", "__delete__", "size", "dim", "ndimension", "numel", "nelement", "stride",
    "storage_offset", "is_contiguous", "is_floating_point", "is_complex", "is_signed", "data_ptr",
    "element_size", "untyped_storage", "storage", "_typed_storage", "get_device", "__len__",
    "__iter__", "__format__", "__repr__", "__str__", "__bool__", "__hash__", "__index__", "__int__",
    "__float__", "__complex__", "__reduce_ex__", "__deepcopy__", "__setstate__", "__getstate__",
    "__contains__", "__array__", "__dlpack__", "__dlpack_device__", "register_hook",
    "register_post_accumulate_grad_hook", "retain_grad", "requires_grad_", "backward", "item",
    "tolist", "numpy", "type", "is_set_to", "has_names", "is_shared", "is_pinned", "__dir__",
    "_is_view", "_version", "is_tensor", "is_storage", "is_grad_enabled", "is_inference",
    "is_inference_mode_enabled", "is_autocast_enabled", "get_default_dtype", "__instancecheck__",
    "__subclasscheck__", "__torch_function__", "__torch_dispatch__", "_has_compatible_shallow_copy_type",
    "is_nonzero", "equal", "__reversed__", "result_type", "can_cast", "promote_types", "_C",
    "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "grad", "_make_subclass",
    "as_subclass", "share_memory_", "pin_memory", "record_stream", "__getattribute__", "dim_order",
    "device", "Size", "dtype", "finfo", "iinfo", "Generator", "get_autocast_dtype", "get_device_module",
    "is_autocast_available", "get_autocast_gpu_dtype", "get_autocast_cpu_dtype", "set_grad_enabled",
})
# Process-group bookkeeping, not collectives.
SKIPPED_DISTRIBUTED = frozenset({
    "get_rank", "get_world_size", "is_initialized", "is_available", "new_group", "get_backend",
    "barrier", "monitored_barrier", "get_process_group_ranks", "get_group_rank", "get_global_rank",
    "destroy_process_group", "init_process_group"})
# Aten bookkeeping ops: no numerics of their own.
SKIPPED_ATEN = frozenset({
    "detach", "alias", "lift_fresh", "lift_fresh_copy", "_to_copy_meta", "empty", "empty_like",
    "empty_strided", "set_", "_local_scalar_dense", "is_same_size",
    "_has_compatible_shallow_copy_type", "result_type", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "_version"})

register_method(*SKIPPED_FUNCTIONS, skip=True)

# In-place ops whose result does not depend on what their first argument held: random and
# constant fills, and copy_. That argument is often fresh, uninitialised memory (dropout's mask
# is `empty_like(x).bernoulli_(p)`; `.to()` copies into an empty tensor at L2).
register_method("bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_",
                "cauchy_", "log_normal_", overwrites_first=True, random=True)
register_method("fill_", "zero_", "copy_", overwrites_first=True)
register_method("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                uninitialized=True)
# FSDP2's all-gather staging: a fresh buffer holding this rank's shards, the other ranks' slots
# uninitialised until the all-gather fills them.
register_method("all_gather_copy_in", uninitialized=True)
# Ops that draw random numbers (a replay would draw new ones).
register_method("dropout", "dropout_", "alpha_dropout", "feature_alpha_dropout", "dropout1d",
                "dropout2d", "dropout3d", "bernoulli", "rand", "rand_like", "randn", "randn_like",
                "randint", "randint_like", "randperm", "multinomial", "normal", "poisson",
                "native_dropout", "rrelu", "rrelu_", "fused_dropout", "_fused_dropout",
                random=True)
register_prefix("Distributed.", collective=True, mutates=True)
register("Tensor.__setitem__", returns_first_argument=True)
# writes into its first argument (an assignment, not a method ending in "_")
register("Tensor.__setitem__", mutates=True)
register_method("_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_",
                loss_scaler=True)
# What replay may run in the recorded dtype instead of float64 (the same values; see OpTraits).
register("Functional.relu", "Torch.relu", "Tensor.relu", "Tensor.relu_", "Torch.relu_",
         "Tensor.flatten", "Torch.flatten", "Tensor.view", "Tensor.reshape", "Torch.reshape",
         exact_in_dtype=True)
register("Tensor.__iadd__", "Tensor.__add__", "Tensor.__radd__", "Tensor.add", "Tensor.add_",
         "Torch.add", exact_backward=True)


__all__ = ["OpTraits", "traits", "register", "register_method", "register_prefix", "method_of",
           "is_mutating", "SKIPPED_FUNCTIONS", "SKIPPED_DISTRIBUTED", "SKIPPED_ATEN"]
