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
    mutates: bool = False             # may write into a tensor it was given (`traits` sets it
                                      # for in-place method names: `add_`, `__iadd__`)
    overwrites_first: bool = False    # writes its first argument without reading it (fill_, copy_)
    uninitialized: bool = False       # returns uninitialised memory (torch.empty and kin)
    random: bool = False              # draws from a random generator
    collective: bool = False          # a torch.distributed collective: depends on other ranks
    routes: bool = False              # a collective sending each rank's pieces to the others
                                      # (all-to-all: expert parallelism's token dispatch)
    loss_scaler: bool = False         # GradScaler's own bookkeeping (unscale, update scale)
    returns_first_argument: bool = False   # returns None, its result is its first argument
    not_replayable: str = ""          # why replay cannot rebuild it ("" = it can be tried)
    # A pure tensor computation: reads no file, makes no storage from a path or buffer, calls
    # nothing it is given. Replay re-runs only these (a dump is untrusted: its op names must
    # not reach torch.load, torch.save, torch.from_file...). See `REPLAY_SAFE`.
    replay_safe: bool = False
    # Its result has no more elements than its tensor arguments broadcast together (an
    # elementwise op, a reduction, a view): replay sizes it from their shapes. Any other op's
    # result is sized on the meta device before it runs (`comparison/replay/sizes.py`).
    sized_by_inputs: bool = False
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
    _replay_safe.cache_clear()


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
    """The traits of an op name (whole name, then method, then prefix; the first that knows),
    `mutates` set for in-place method names. Cached: capture asks on every recorded call (a
    `register` call clears the cache)."""
    found = _registered(op)
    if not found.mutates and _in_place(method_of(op)):
        found = replace(found, mutates=True)
    return found


def _in_place(method: str) -> bool:
    """`add_`, `__iadd__`: a method name that says it writes into its tensor."""
    return (method.endswith("_") and not method.endswith("__")) or method.startswith("__i")


def _registered(op: str) -> OpTraits:
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


def replay_refusal(op: str) -> str:
    """Why replay must not re-run an op, or "": what its traits forbid (`OpTraits.replay_refusal`),
    else anything that is neither `replay_safe` (under its whole name, its method name or a
    prefix: traits set under any of them count) nor has a registered `cpu_reference`."""
    found = traits(op)
    if found.replay_refusal:
        return found.replay_refusal
    if found.cpu_reference is not None or _replay_safe(op):
        return ""
    return (f"untrusted: {op[:80]} is not an op replay trusts (only pure tensor computations on the dump's "
            f"tensors are re-run; opdiff.ops.register_method(name, replay_safe=True) adds one)")


@functools.lru_cache(maxsize=4096)
def _replay_safe(op: str) -> bool:
    method = method_of(op)
    if not method.isidentifier() or not op.startswith(_REPLAY_NAMESPACES):
        return False
    if op.startswith("Aten.") and op.count(".") >= 2:
        overload = op.split(".", 2)[2]
        if overload == "out" or overload.endswith("_out") or not overload.isidentifier():
            return False                # writes into a tensor it is handed
    return any(t.replay_safe for t in _entries(op))


def sized_by_inputs(op: str) -> bool:
    """Whether an op's result is no larger than its tensor arguments broadcast together
    (`OpTraits.sized_by_inputs`, set under its whole name, its method name or a prefix)."""
    return any(t.sized_by_inputs for t in _entries(op))


def _entries(op: str) -> list[OpTraits]:
    """Every traits entry that names an op: its whole name, its method, its aten overload, its
    prefixes."""
    method = method_of(op)
    entries = [_BY_NAME.get(op), _BY_METHOD.get(method)]
    if op.startswith("Aten.") and op.count(".") >= 2:
        entries.append(_BY_METHOD.get(op.split(".", 1)[1]))
    entries += [t for prefix, t in _BY_PREFIX.items() if op.startswith(prefix)]
    return [t for t in entries if t is not None]


# What replay resolves op names in (`comparison/replay/calls.py`).
_REPLAY_NAMESPACES = ("Torch.", "Tensor.", "Functional.", "VF.", "Aten.")


def is_mutating(op: str, kwargs: dict) -> bool:
    """Whether a call may write into a tensor it was given: in-place methods (`add_`,
    `__iadd__`, `__setitem__`), collectives, `out=` and `inplace=True`."""
    return traits(op).mutates or (bool(kwargs) and (kwargs.get("out") is not None
                                                    or kwargs.get("inplace") is True))


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
# torch.nn.init's in-place initialisers (recorded as `Torch.<name>`): a lazy module's first
# forward materialises its parameters as uninitialised memory and then fills them with these.
register_method("kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
                "trunc_normal_", "orthogonal_", "sparse_", overwrites_first=True, random=True)
register_method("zeros_", "ones_", "constant_", "eye_", "dirac_", overwrites_first=True)
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
register("Distributed.all_to_all", "Distributed.all_to_all_single", collective=True, mutates=True,
         routes=True)
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

# What replay may re-run (`replay_safe`): pure tensor computations whose CPU kernels check the
# arguments a dump can give them (sizes, strides, indices, dtypes), or whose arguments replay
# checks itself first (`comparison/replay/guards.py`: index tensors against their table, views
# against their storage, results against --max-tensor-mb); by method name in every namespace
# (`add` covers Torch.add, Tensor.add, Aten.add), backward kernels by their own names.
# tests/security/test_replay_fuzz.py calls every op admitted here with hostile arguments.
# Left out because their kernels trust what they are given: ctc_loss (lengths), and any
# backward kernel not listed. Left out on purpose: anything that reads or writes files or makes storage from a path,
# buffer or pointer (load, save, from_file, frombuffer, from_numpy, set_, storage), calls what
# it is given (apply_, map_, register_hook) or changes process state (manual_seed,
# set_default_dtype). Replay also refuses `out=`, string arguments that are not known enums
# (`comparison/replay/calls.py`) and tensors over `--max-tensor-mb`.
REPLAY_SAFE = frozenset("""
__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__
__rtruediv__ __itruediv__ __div__ __rdiv__ __idiv__ __floordiv__ __rfloordiv__ __ifloordiv__
__mod__ __rmod__ __imod__ __pow__ __rpow__ __ipow__ __matmul__ __rmatmul__ __neg__ __pos__
__abs__ __invert__ __and__ __rand__ __iand__ __or__ __ror__ __ior__ __xor__ __rxor__ __ixor__
__lshift__ __rlshift__ __ilshift__ __rshift__ __rrshift__ __irshift__ __eq__ __ne__ __lt__
__le__ __gt__ __ge__ __getitem__ __setitem__
abs absolute acos arccos acosh arccosh asin arcsin asinh arcsinh atan arctan atan2 arctan2 atanh
arctanh add addbmm addcdiv addcmul addmm addmv addr baddbmm bmm ceil clamp clamp_min clamp_max
clip copysign cos cosh deg2rad digamma div divide dot erf erfc erfinv exp exp2 expm1 float_power
floor floor_divide fmod frac hypot i0 igamma igammac lerp lgamma log log10 log1p log2 logaddexp
logaddexp2 logit matmul mm mv mul multiply mvlgamma nan_to_num neg negative nextafter polygamma
pow rad2deg reciprocal remainder round rsqrt sgn sigmoid sign signbit sin sinc sinh sqrt square
sub subtract rsub tan tanh trunc fix true_divide xlogy outer ger inner kron tensordot einsum
chain_matmul linear bilinear cross cumsum cumprod cummax cummin logcumsumexp diff
eq ne lt le gt ge equal greater greater_equal less less_equal not_equal isclose allclose isfinite
isinf isnan isneginf isposinf isreal logical_and logical_or logical_not logical_xor
bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift
maximum minimum fmax fmin max min amax amin aminmax argmax argmin mean nanmean sum nansum prod
std var std_mean var_mean median nanmedian mode norm frobenius_norm nuclear_norm dist renorm
logsumexp all any count_nonzero sort argsort msort topk kthvalue unique unique_consecutive
searchsorted bucketize histc bincount cdist
where masked_fill masked_scatter masked_select index_select index_add index_copy index_fill
index_put index_reduce gather scatter scatter_add scatter_reduce take take_along_dim put
nonzero argwhere tril triu diag diagonal diag_embed diagflat trace
view view_as reshape reshape_as flatten unflatten squeeze unsqueeze permute transpose swapaxes
swapdims moveaxis movedim t T mT H mH adjoint contiguous clone detach expand expand_as
broadcast_to broadcast_tensors repeat repeat_interleave tile flip fliplr flipud roll rot90
narrow narrow_copy select slice slice_scatter select_scatter diagonal_scatter as_strided
unfold split split_with_sizes tensor_split chunk unbind cat concat concatenate stack hstack
vstack dstack column_stack row_stack atleast_1d atleast_2d atleast_3d meshgrid cartesian_prod
combinations block_diag view_as_real view_as_complex real imag conj conj_physical resolve_conj
resolve_neg angle polar complex _unsafe_view _reshape_alias alias_copy
to type_as float double half bfloat16 int long short char byte bool cfloat cdouble
zeros ones full arange range linspace logspace eye tensor scalar_tensor zeros_like ones_like
full_like new_zeros new_ones new_full new_tensor tril_indices triu_indices
fill fill_ zero_ copy_ masked_fill_ index_put_ index_add_ index_copy_ index_fill_ scatter_
scatter_add_ scatter_reduce_ put_ clamp_ clamp_min_ clamp_max_ add_ sub_ mul_ div_ pow_
addcmul_ addcdiv_ lerp_ neg_ abs_ exp_ log_ sqrt_ rsqrt_ sigmoid_ tanh_ relu_ floor_ ceil_
round_ trunc_ sign_ reciprocal_ fmod_ remainder_ copysign_ nan_to_num_ masked_scatter_
baddbmm_ addmm_ addmv_ addbmm_ addr_ tril_ triu_ t_ transpose_ squeeze_ unsqueeze_ resize_
resize_as_ erf_ erfinv_ exp2_ expm1_ log1p_ log2_ log10_ sin_ cos_ tan_ atan2_ hardtanh_
leaky_relu_ elu_ selu_ celu_ silu_ mish_ hardsigmoid_ hardswish_ threshold_ logit_ clip_
relu relu6 elu selu celu gelu silu mish softplus softsign softshrink hardshrink tanhshrink
hardtanh hardsigmoid hardswish leaky_relu prelu glu logsigmoid threshold sigmoid_ tanh_
softmax log_softmax softmin _softmax _log_softmax _softmax_backward_data
_log_softmax_backward_data normalize cosine_similarity pairwise_distance pdist
layer_norm native_layer_norm group_norm native_group_norm batch_norm native_batch_norm
_native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
instance_norm local_response_norm rms_norm _fused_rms_norm embedding embedding_bag
embedding_dense_backward one_hot
conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution
_convolution conv_tbc
avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d max_pool1d_with_indices
max_pool2d_with_indices max_pool3d_with_indices adaptive_avg_pool1d adaptive_avg_pool2d
adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d lp_pool1d
lp_pool2d _adaptive_avg_pool2d _adaptive_avg_pool3d max_unpool1d max_unpool2d max_unpool3d
pixel_shuffle pixel_unshuffle channel_shuffle pad constant_pad_nd reflection_pad1d
reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d
interpolate upsample upsample_nearest1d upsample_nearest2d upsample_nearest3d
upsample_linear1d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d grid_sample
affine_grid fold im2col col2im
scaled_dot_product_attention _scaled_dot_product_attention_math
_scaled_dot_product_flash_attention_for_cpu multi_head_attention_forward
lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
cross_entropy nll_loss nll_loss2d nll_loss_nd nll_loss_forward nll_loss2d_forward mse_loss
l1_loss smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits kl_div
poisson_nll_loss gaussian_nll_loss cosine_embedding_loss hinge_embedding_loss
margin_ranking_loss multi_margin_loss multilabel_margin_loss multilabel_soft_margin_loss
soft_margin_loss triplet_margin_loss
inverse det logdet slogdet cholesky cholesky_solve cholesky_inverse qr svd svdvals eig eigh
eigvals eigvalsh lstsq lu lu_factor lu_solve solve solve_triangular triangular_solve pinv
matrix_norm vector_norm matrix_rank matrix_power matrix_exp multi_dot householder_product
vander fft ifft fft2 ifft2 fftn ifftn rfft irfft rfft2 irfft2 rfftn irfftn hfft ihfft fftshift
ifftshift fftfreq rfftfreq
_to_copy _unsafe_index _unsafe_index_put _unsafe_masked_index_put_accumulate
_foreach_add _foreach_mul _foreach_div _foreach_sub
_foreach_add_ _foreach_mul_ _foreach_div_ _foreach_sub_ _foreach_sqrt _foreach_addcmul_
_foreach_addcdiv_ _foreach_lerp_ _foreach_norm
dropout dropout_ alpha_dropout feature_alpha_dropout dropout1d dropout2d dropout3d native_dropout
bernoulli bernoulli_ rand rand_like randn randn_like randint randint_like randperm multinomial
normal normal_ uniform_ poisson rrelu
_adaptive_avg_pool2d_backward _adaptive_avg_pool3d_backward _fused_rms_norm_backward
_scaled_dot_product_flash_attention_for_cpu_backward adaptive_avg_pool3d_backward
adaptive_max_pool2d_backward adaptive_max_pool3d_backward avg_pool2d_backward avg_pool3d_backward
batch_norm_backward binary_cross_entropy_backward conv_tbc_backward convolution_backward
cumprod_backward diagonal_backward elu_backward embedding_backward embedding_dense_backward
gather_backward gelu_backward glu_backward hardshrink_backward hardsigmoid_backward
hardswish_backward hardtanh_backward huber_loss_backward index_select_backward
leaky_relu_backward linear_backward logit_backward masked_scatter_backward masked_select_backward
matmul_backward matrix_exp_backward max_pool2d_backward max_pool2d_with_indices_backward
max_pool3d_with_indices_backward mish_backward mse_loss_backward multi_margin_loss_backward
multilabel_margin_loss_backward native_batch_norm_backward native_dropout_backward
native_group_norm_backward native_layer_norm_backward nll_loss2d_backward nll_loss_backward
reflection_pad1d_backward reflection_pad2d_backward reflection_pad3d_backward
replication_pad1d_backward replication_pad2d_backward replication_pad3d_backward select_backward
sigmoid_backward silu_backward slice_backward smooth_l1_loss_backward soft_margin_loss_backward
softplus_backward softshrink_backward tanh_backward threshold_backward trace_backward
unfold_backward upsample_bicubic2d_backward upsample_bilinear2d_backward
upsample_linear1d_backward upsample_nearest1d_backward upsample_nearest2d_backward
upsample_nearest3d_backward upsample_trilinear3d_backward
""".split())   # (the random ones last: replay refuses them when they draw, `running.rng_guard`)
register_method(*REPLAY_SAFE, replay_safe=True)
register("Torch.linalg.cond", replay_safe=True)     # (not `Torch.cond`: a control-flow op)

# Ops whose result is no larger than their tensor arguments broadcast together (see OpTraits):
# elementwise ops, activations, reductions, views of the same elements.
SIZED_BY_INPUTS = frozenset("""
__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__
__rtruediv__ __itruediv__ __div__ __rdiv__ __idiv__ __floordiv__ __rfloordiv__ __ifloordiv__
__mod__ __rmod__ __imod__ __pow__ __rpow__ __ipow__ __neg__ __pos__ __abs__ __invert__ __and__
__rand__ __iand__ __or__ __ror__ __ior__ __xor__ __rxor__ __ixor__ __eq__ __ne__ __lt__ __le__
__gt__ __ge__ abs absolute acos arccos acosh arccosh asin arcsin asinh arcsinh atan arctan atan2
arctan2 atanh arctanh add addcdiv addcmul ceil clamp clamp_min clamp_max clip copysign cos cosh
deg2rad digamma div divide erf erfc erfinv exp exp2 expm1 float_power floor floor_divide fmod
frac hypot i0 igamma igammac lerp lgamma log log10 log1p log2 logaddexp logaddexp2 logit mul
multiply nan_to_num neg negative nextafter pow rad2deg reciprocal remainder round rsqrt sgn
sigmoid sign signbit sin sinc sinh sqrt square sub subtract rsub tan tanh trunc fix true_divide
xlogy eq ne lt le gt ge greater greater_equal less less_equal not_equal isclose isfinite isinf
isnan isneginf isposinf isreal logical_and logical_or logical_not logical_xor bitwise_and
bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift maximum minimum fmax
fmin amax amin sum nansum mean nanmean prod all any where masked_fill
relu relu6 elu selu celu gelu silu mish softplus softsign softshrink hardshrink tanhshrink
hardtanh hardsigmoid hardswish leaky_relu logsigmoid threshold softmax log_softmax softmin
_softmax _log_softmax view view_as reshape reshape_as flatten squeeze unsqueeze permute
transpose swapaxes swapdims moveaxis movedim t T mT H mH adjoint contiguous clone detach
_unsafe_view to type_as float double half bfloat16 int long short char byte bool
fill_ zero_ copy_ masked_fill_ clamp_ clamp_min_ clamp_max_ add_ sub_ mul_ div_ pow_ addcmul_
addcdiv_ lerp_ neg_ abs_ exp_ log_ sqrt_ rsqrt_ sigmoid_ tanh_ relu_ floor_ ceil_ round_ trunc_
sign_ reciprocal_ fmod_ remainder_ copysign_ nan_to_num_ erf_ erfinv_ exp2_ expm1_ log1p_ log2_
log10_ sin_ cos_ tan_ atan2_ hardtanh_ leaky_relu_ elu_ selu_ celu_ silu_ mish_ hardsigmoid_
hardswish_ threshold_ logit_ clip_ threshold_backward gelu_backward silu_backward
sigmoid_backward tanh_backward
""".split())
register_method(*SIZED_BY_INPUTS, sized_by_inputs=True)

# The string arguments replay passes on: enum values of torch's ops (reduction, approximate,
# rounding_mode, padding and interpolation modes, norms, fft norms, sides, drivers...). Any other
# string refuses the op (a path, a file name, code). einsum's equation is checked by its shape.
REPLAY_STRINGS = frozenset("""
none mean sum batchmean tanh trunc floor constant reflect replicate circular zeros border
reflection nearest nearest-exact linear bilinear bicubic trilinear area same valid relu fro nuc
reduced complete r L U left right backward forward ortho lower higher midpoint ij xy prod amax
amin gels gelsy gelsd gelss use_mm_for_euclid_dist_if_necessary use_mm_for_euclid_dist
donot_use_mm_for_euclid_dist
""".split())
_EQUATION = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.->")


def replay_string(op: str, value: str) -> bool:
    """Whether replay may pass the string `value` to `op` (`REPLAY_STRINGS`, or an einsum
    equation made of letters, commas, dots, spaces and ->)."""
    if value in REPLAY_STRINGS:
        return True
    return method_of(op) == "einsum" and 0 < len(value) <= 256 and set(value) <= _EQUATION


__all__ = ["OpTraits", "traits", "replay_refusal", "replay_string", "REPLAY_SAFE", "REPLAY_STRINGS",
           "SIZED_BY_INPUTS", "sized_by_inputs",
           "register", "register_method", "register_prefix", "method_of",
           "is_mutating", "SKIPPED_FUNCTIONS", "SKIPPED_DISTRIBUTED", "SKIPPED_ATEN"]
