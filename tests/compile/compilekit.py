"""One training step of a tiny Hugging Face Llama (built from a config), eager or under
`torch.compile`, with or without opdiff, and a wrong CPU kernel of one aten op planted in the
process that runs it (see conftest.py's `compiled_dump`)."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import torch

import opdiff

LAYERS = 2


def llama(layers: int = LAYERS, attn: str = "eager") -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg).eval()


@dataclass
class Step:
    """What one step left: its loss and gradients, dynamo's counters, and the dump."""
    loss: torch.Tensor
    grads: torch.Tensor
    counters: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: Optional[Path] = None


def run_step(path: Optional[Path], level: str = "L2", backend: Optional[str] = None,
             fault: Optional[str] = None, task: str = "statistics", layers: int = LAYERS,
             attn: str = "eager") -> Step:
    """One forward and backward; compiled with `backend` when given; dumped into `path` when
    given; `fault` = "op:call" spoils that call of the op's CPU kernel (scale 1.01); `attn`:
    the model's attention implementation ("sdpa": HF's default)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    model = llama(layers, attn)
    run = torch.compile(model, backend=backend) if backend else model
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    counters.clear()
    planted = spoil(*fault.split(":")) if fault else nullcontext()
    with planted as hits:
        with opdiff.dump(model, str(path), level=level, task=task) if path else nullcontext():
            loss = run(ids, labels=ids).loss
            loss.backward()
    if fault:
        assert hits == [int(fault.split(":")[1])], hits   # spoiled exactly once
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    seen = {k: dict(v) for k, v in counters.items()
            if k in ("stats", "graph_break", "recompiles", "frames")}
    torch._dynamo.reset()
    return Step(loss.detach(), grads, seen, path)


@contextmanager
def spoil(op: str, call: str, scale: float = 1.01) -> Iterator[list[int]]:
    """Replace the CPU kernel of `aten::<op>` (silu, silu_backward) in this process: its `call`-th call (from 0)
    returns its output times `scale`: a wrong kernel, under every recorder and compiler."""
    count = [0]
    hits: list[int] = []
    lib = torch.library.Library("aten", "IMPL")

    def spoiled(out: torch.Tensor) -> torch.Tensor:
        if count[0] == int(call):
            hits.append(count[0])
            out = out * scale
        count[0] += 1
        return out

    # (not aten::silu itself: that would call this kernel again)
    def silu(x: torch.Tensor) -> torch.Tensor:
        return spoiled(x * torch.sigmoid(x))

    def silu_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)
        return spoiled(grad * s * (1 + x * (1 - s)))

    kernels = {"silu": silu, "silu_backward": silu_backward}
    if op not in kernels:
        raise ValueError(f"only {sorted(kernels)} are planted here")
    lib.impl(op, kernels[op], "CPU")
    try:
        yield hits
    finally:
        lib._destroy()


@contextmanager
def fresh_compile() -> Iterator[None]:
    """Inductor compiles in this process, without its caches (a cached wrapper was not
    generated while opdiff recorded: its kernels have no program for `opdiff check`)."""
    from torch._functorch import config as aot_config
    from torch._inductor import config

    with config.patch(fx_graph_cache=False), aot_config.patch(enable_autograd_cache=False):
        yield


@contextmanager
def wrong_decomposition(op: Any, decomposed: Any) -> Iterator[None]:
    """Inductor decomposes the aten overload `op` as `decomposed` in this process (caches off,
    so that no other test compiles with it or reads what it compiled)."""
    from torch._inductor import decomposition

    before = decomposition.decompositions.get(op)
    decomposition.decompositions[op] = decomposed
    decomposition.fast_random_decomps.cache_clear()     # (a copy of the table, made once)
    try:
        with fresh_compile():
            yield
    finally:
        if before is None:
            decomposition.decompositions.pop(op, None)
        else:
            decomposition.decompositions[op] = before
        decomposition.fast_random_decomps.cache_clear()


def wrong_silu_decomposition(scale: float = 1.001) -> Any:
    """Inductor decomposes `aten.silu` as `x * sigmoid(x) * scale` in this process."""
    return wrong_decomposition(torch.ops.aten.silu.default,
                               lambda x: x * torch.sigmoid(x) * scale)


def wrong_rsqrt_decomposition(scale: float = 1.001) -> Any:
    """Inductor decomposes `aten.rsqrt` (the RMSNorm's `1 / sqrt(variance + eps)`) as
    `reciprocal(sqrt(x)) * scale` in this process: a norm's decomposition gone wrong, the kind
    of pytorch#168126."""
    return wrong_decomposition(torch.ops.aten.rsqrt.default,
                               lambda x: torch.reciprocal(torch.sqrt(x)) * scale)


@contextmanager
def wrong_decomposition_in(op: Any, right: Any, module: str,
                           scale: float = 1.001) -> Iterator[list[str]]:
    """Inductor decomposes the aten overload `op` as `right` (a correct decomposition) times
    `scale` only for the nodes traced inside the module at path `module` (`model.norm`): the
    node's own module stack, as the compiler records it while tracing; elsewhere as `right`.
    Yields the module paths of the nodes it spoiled (the caller checks that it spoiled what it
    meant to)."""
    import torch.fx.traceback as fx_traceback

    spoiled: list[str] = []

    def decomposed(*args: Any) -> torch.Tensor:
        stack = fx_traceback.get_current_meta().get("nn_module_stack") or {}
        paths = [str(path) for path, _ in stack.values()]
        out = right(*args)
        if paths and (paths[-1] == module or paths[-1].endswith("." + module)):
            spoiled.append(paths[-1])
            return out * scale
        return out
    with wrong_decomposition(op, decomposed):
        yield spoiled


def wrong_rsqrt_decomposition_in(module: str, scale: float = 1.001) -> Any:
    """Inductor decomposes `aten.rsqrt` wrongly (as `wrong_rsqrt_decomposition`) only inside
    the module at path `module` (`wrong_decomposition_in`)."""
    return wrong_decomposition_in(torch.ops.aten.rsqrt.default,
                                  lambda x: torch.reciprocal(torch.sqrt(x)), module, scale)


def wrong_softmax_decomposition_in(module: str, scale: float = 1.001) -> Any:
    """Inductor decomposes `aten._softmax` as `exp(x - max) / sum * scale` only inside the
    module at path `module` (an attention, whose kernels straddle its calls: not judged)."""
    def softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        e = torch.exp(x - torch.amax(x, dim, keepdim=True))
        return e / e.sum(dim, keepdim=True)
    return wrong_decomposition_in(torch.ops.aten._softmax.default, softmax, module, scale)
