"""Eager golden against Inductor on the CPU under bf16 autocast, both recorded at level mix (the
tiny Llama; forward under `torch.autocast("cpu", dtype=torch.bfloat16)`, backward outside).

Autocast casts each Linear's fp32 weight to bf16 inside the Linear's call; Inductor fuses those
casts (and the bf16 cast of a Linear's input) into the kernel of the code before it: the
embedding's kernel casts every attention projection's weight, a layer's residual-add-and-norm
kernel the gate projection's, the silu kernel the down projection's. Named by module, each such
kernel straddled the Linears it casts for, and only 6 module calls were judged. Now a dtype cast
names no module (capture/kernel_modules.py), and each output a kernel computes from parameters
alone says so (`compiled.from_parameters`: the cast weight and its parameter's name), so the
Linear reading it judges it as its own parameter's and the kernel that made it hands out no
data of its own (comparison/compiled_modules.py). The same 17 module calls as in fp32 are judged
at their boundaries; a wrong `aten.silu` decomposition is named at layer 0's MLP.

The healthy step is conclusive: its float32 parameter gradients, made by the compiled backward
in bf16 and never named at mix, and the float32 residual stream after the embedding-to-first-norm
span (not judged: Inductor also fuses the root's padding of the labels into that kernel, code
outside every module call) differ from eager's by 1e-5 to 6.5e-3: beyond float32's tolerance,
within the run's precision, bf16, which is what they are judged by. A wrong backward beyond it
still makes the pair "inconclusive"."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opdiff
from compilekit import fresh_compile, llama, wrong_decomposition, wrong_silu_decomposition
from opdiff.comparison.compiled_modules import module_calls
from opdiff.comparison.compiled_spans import span_calls
from opdiff.report.console import verdict_line
from opdiff.store.schema import complete

pytestmark = pytest.mark.slow
MLP = "Module.model.layers.0.mlp.LlamaMLP.forward.0"
LINEARS = [f"model.layers.{i}.{m}" for i in range(2) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")] + ["lm_head"]


def _step(path: Path, backend=None) -> Path:
    import torch._dynamo
    model = llama()
    run = torch.compile(model, backend=backend) if backend else model
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with fresh_compile(), opdiff.dump(model, str(path), level="mix"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(ids, labels=ids).loss
        loss.backward()
    torch._dynamo.reset()
    return path


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    root = tmp_path_factory.mktemp("inductor_mix_autocast")
    out = {"eager": _step(root / "eager"), "healthy": _step(root / "healthy", "inductor")}
    # (bf16's tolerance: a 0.1% error of the silu vanishes in the bf16 rounding of its output)
    with wrong_silu_decomposition(1.05):
        out["silu"] = _step(root / "silu", "inductor")
    with wrong_decomposition(torch.ops.aten.silu_backward.default, _silu_backward(1.05)):
        out["silu_backward"] = _step(root / "silu_backward", "inductor")
    return out


def _silu_backward(scale: float):
    def decomposed(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)
        return grad * s * (1 + x * (1 - s)) * scale
    return decomposed


def _records(path: Path) -> list[dict]:
    lines = (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines()
    return [complete(json.loads(line)) for line in lines]


def test_weight_casts_name_no_module_and_say_their_parameters(steps):
    kernels = [r for r in _records(steps["healthy"]) if r["kind"] == "kernel"]
    cast = {fqn: (r["compiled"]["modules"], r["outputs"][slot]) for r in kernels
            for slot, fqns in r["compiled"].get("from_parameters", ()) for fqn in fqns}
    # every Linear's weight is cast to bf16 by a kernel, which says which parameter it cast
    assert sorted(cast) == sorted(f"{m}.weight" for m in LINEARS), sorted(cast)
    assert all(out["dtype"] == "bfloat16" for _, out in cast.values())
    # the silu kernel casts down_proj's weight: it names the MLP and its activation only
    silu = [r["compiled"]["modules"] for r in kernels if "silu" in r["compiled"]["node"]]
    assert silu == [[f"model.layers.{i}.mlp", f"model.layers.{i}.mlp.act_fn"] for i in range(2)]
    # a kernel that only casts a weight still names the module it casts for
    only = [r for r in kernels if r["compiled"]["node"].startswith("cpp_fused__to_copy_t_")]
    assert only and all(r["compiled"]["modules"] == [r["compiled"]["from_parameters"][0][1][0]
                                                     .rsplit(".", 1)[0]] for r in only)


def test_healthy_judges_every_module_call_fp32_does_and_names_nothing(steps):
    golden, target = _records(steps["eager"]), _records(steps["healthy"])
    t, _ = span_calls(module_calls(target, golden), golden)
    made = [r["name"] for r in t if r["kind"] == "module"]
    calls = [n for n in made if not n.endswith(".Span.forward.0")]
    # (before: 6 module calls, no span; fp32 judges these 17 and 6 spans)
    assert len(calls) == 17 and all(any(f".{m}." in n or n.startswith(f"Module.{m}.")
                                        for n in calls) for m in LINEARS), calls
    assert MLP in calls and "Module.model.layers.1.mlp.LlamaMLP.forward.0" in calls
    assert len(made) - len(calls) >= 5, made
    result = opdiff.compare(str(steps["healthy"]), str(steps["eager"]),
                            str(steps["healthy"].parent / "out_healthy"), progress=False)
    assert result.first_divergence is None, result.first_divergence


def test_wrong_silu_decomposition_is_named_at_the_first_mlp(steps):
    result = opdiff.compare(str(steps["silu"]), str(steps["eager"]),
                            str(steps["silu"].parent / "out_silu"), progress=False)
    first = result.first_divergence
    assert first is not None and first.name == MLP, first
    assert "silu" in first.reason and first.tensor == f"{MLP}.output.0", first


def test_healthy_is_conclusive_float32_tensors_made_in_bf16_are_judged_at_bf16(steps):
    # (before: "inconclusive", through 21 parameter gradients the bf16 compiled backward made
    # and the float32 residual stream after the unjudged first span: they differ from eager's
    # by 1e-5 to 6.5e-3, beyond float32's tolerance and within the run's, bf16)
    result = opdiff.compare(str(steps["healthy"]), str(steps["eager"]),
                            str(steps["healthy"].parent / "out_rest"), progress=False)
    assert result.first_divergence is None, result.first_divergence
    assert not verdict_line(result).startswith("inconclusive"), verdict_line(result)
    grads = [r for r in result.rows if r.target_name and ".parameters_grad." in r.target_name]
    assert len(grads) >= 20 and max(r.error for r in grads) > 1e-3, grads   # (not alike)
    assert max(r.error for r in grads) < 1.6e-2


def test_a_wrong_backward_beyond_bf16_stays_inconclusive_naming_its_gradients(steps):
    # the compiled backward is not recorded at mix: a wrong silu_backward (x1.05) shows only in
    # the parameter gradients computed from it, beyond bf16's tolerance: never "no op is to
    # blame"
    result = opdiff.compare(str(steps["silu_backward"]), str(steps["eager"]),
                            str(steps["healthy"].parent / "out_back"), progress=False)
    line = verdict_line(result)
    assert result.first_divergence is None and line.startswith("inconclusive"), line
    assert "mlp.gate_proj.Linear.parameters_grad" in line or "mlp.up_proj" in line, line
    assert "made by the compiled backward, which is not recorded" in line, line
