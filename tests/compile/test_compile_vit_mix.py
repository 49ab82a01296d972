"""A ViT-like encoder (pre-norm blocks of `nn.MultiheadAttention` and an MLP) eager against
Inductor at level mix, with Inductor's LayerNorm decomposition wrong in the second block's
`ln_1` only (issue 46, item 7).

Inductor fuses that norm with the attention's input projection prep and with the first block's
residual add, and the residual stream into the final mean: no module call or span holding the
norm closes, so the pair stays "inconclusive". What it says must point where the evidence
does: at the compiled calls that made the first judged call's differing input, back to tensors
judged calls agree on, not at every call before it (before: the first block's `ln_2` too,
made before the first block's MLP, which is judged and agrees), and every kernel it cites must
compute code of the modules it names."""
from __future__ import annotations

import contextlib
import re

import pytest
import torch
from torch import nn

import opdiff
from compilekit import fresh_compile, wrong_decomposition
from opdiff.store import open_dump


class EncoderBlock(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.self_attention = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.Sequential(EncoderBlock(), EncoderBlock())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)).mean(1))


@contextlib.contextmanager
def wrong_layer_norm_in(module: str, scale: float = 1.001):
    """Inductor decomposes `aten.native_layer_norm` with its output x`scale` only for the nodes
    traced inside `module`; yields the module paths it spoiled."""
    import torch.fx.traceback as fx_traceback

    hits: list[str] = []

    def layer_norm(x, shape, w, b, eps):
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + eps)
        stack = fx_traceback.get_current_meta().get("nn_module_stack") or {}
        paths = [str(path) for path, _ in stack.values()]
        spoiled = bool(paths) and (paths[-1] == module or paths[-1].endswith("." + module))
        if spoiled:
            hits.append(paths[-1])
        return (x - mean) * rstd * w * (scale if spoiled else 1.0) + b, mean, rstd

    with wrong_decomposition(torch.ops.aten.native_layer_norm.default, layer_norm):
        yield hits


def _step(path, compiled: bool, spoil=None):
    import torch._dynamo
    torch.manual_seed(0)
    model = Net()
    run = torch.compile(model, backend="inductor") if compiled else model
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with spoil or fresh_compile() as hits, \
            opdiff.dump(model, str(path), level="mix", task="statistics"):
        nn.functional.cross_entropy(run(x), torch.tensor([1, 3])).backward()
    torch._dynamo.reset()
    if spoil is not None:
        assert hits, "the decomposition spoiled nothing"
    return path


@pytest.mark.slow
def test_an_unjudged_wrong_norm_points_at_the_calls_that_made_the_differing_input(tmp_path):
    eager = _step(tmp_path / "eager", False)
    target = _step(tmp_path / "ln", True, wrong_layer_norm_in("blocks.1.ln_1"))
    result = opdiff.compare(target, eager)
    assert result.first_divergence is None and result.verdict.startswith("inconclusive"), \
        result.verdict
    said = result.verdict
    assert "the input of `blocks.1.mlp.0` already differs" in said, said
    code = said.split("not judged before it:", 1)[1].split("; the difference", 1)[0]
    named = set(re.findall(r"`([\w.]+)`", code.split("computing code of", 1)[1]))
    assert "blocks.1.ln_1" in named, code
    # made before `blocks.0.mlp`, which is judged and agrees: not where the input was made
    assert "blocks.0.ln_2" not in named, code
    # every kernel cited computes code of the modules named, and nothing else
    records = list(open_dump(target / "step0" / "rank0").records())
    nodes = {(r.get("compiled") or {}).get("node"): r for r in records
             if r["phase"] == "forward" and r.get("compiled")}
    cited = [n for n in re.findall(r"`(cpp_fused\w+)`", code)]
    assert cited, code
    for node in cited:
        assert node in nodes, node
        assert set(nodes[node]["compiled"]["modules"]) <= named, (node, named)
