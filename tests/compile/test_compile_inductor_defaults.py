"""Eager against Inductor at level mix with what a user's script has by default: Hugging Face's
default attention (SDPA, which Inductor runs on the CPU as a fallback to
`aten._scaled_dot_product_flash_attention_for_cpu`, its results taken apart by two more extern
nodes; the tiny Llama and a tiny Mistral), and Inductor's on-disk cache warmed by an earlier run of the script without opdiff.
Before, either made every compare "inconclusive: ... kernels whose modules are not known": the
fallback's call lines were not counted among the extern calls (so no extern call got its
modules), and a cached wrapper named none."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import opdiff
from compilekit import fresh_compile, run_step, wrong_silu_decomposition
from opdiff.report.console import verdict_line

pytestmark = pytest.mark.slow
MLP = "Module.model.layers.0.mlp.LlamaMLP.forward.0"


@pytest.fixture(scope="module")
def sdpa(tmp_path_factory):
    root = tmp_path_factory.mktemp("inductor_sdpa")
    out = {"eager": run_step(root / "eager", "mix", attn="sdpa").path}
    with fresh_compile():
        out["healthy"] = run_step(root / "healthy", "mix", backend="inductor", attn="sdpa").path
    with wrong_silu_decomposition():
        out["silu"] = run_step(root / "silu", "mix", backend="inductor", attn="sdpa").path
    return out


def _records(path: Path) -> list[dict]:
    lines = (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_sdpa_extern_calls_name_their_modules(sdpa):
    calls = [r for r in _records(sdpa["healthy"]) if r.get("compiled")
             and r["kind"] != "kernel" and r["phase"] == "forward"]
    attention = [r for r in calls if "scaled_dot_product" in r["op"]]
    assert len(attention) == 2, [r["op"] for r in calls]
    assert [r["compiled"].get("modules") for r in attention] == [
        [f"model.layers.{i}.self_attn"] for i in range(2)]
    assert all(r["compiled"].get("modules") for r in calls), [
        r["name"] for r in calls if not r["compiled"].get("modules")]


def test_sdpa_healthy_names_nothing_and_a_wrong_silu_is_named_at_the_mlp(sdpa, tmp_path):
    healthy = opdiff.compare(str(sdpa["healthy"]), str(sdpa["eager"]), str(tmp_path / "h"),
                             progress=False)
    assert healthy.first_divergence is None, healthy.first_divergence
    assert not verdict_line(healthy).startswith("inconclusive"), verdict_line(healthy)
    first = opdiff.compare(str(sdpa["silu"]), str(sdpa["eager"]), str(tmp_path / "s"),
                           progress=False).first_divergence
    assert first is not None and first.name == MLP, first
    assert "silu" in first.reason, first.reason


def _mistral_step(path: Path, backend=None) -> Path:
    """One forward and backward of a tiny Mistral with its default attention (SDPA), at mix."""
    import torch
    import torch._dynamo
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    assert model.config._attn_implementation == "sdpa"
    run = torch.compile(model, backend=backend) if backend else model
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with opdiff.dump(model, str(path), level="mix"):
        run(input_ids=ids, labels=ids).loss.backward()
    torch._dynamo.reset()
    return path


def test_another_family_with_its_default_attention_too(tmp_path):
    # (a tiny Mistral: SDPA by default, as the Llama above)
    eager = _mistral_step(tmp_path / "eager")
    with fresh_compile():
        healthy = _mistral_step(tmp_path / "healthy", "inductor")
    with wrong_silu_decomposition():
        silu = _mistral_step(tmp_path / "silu", "inductor")
    result = opdiff.compare(str(healthy), str(eager), str(tmp_path / "h"), progress=False)
    assert result.first_divergence is None, result.first_divergence
    assert not verdict_line(result).startswith("inconclusive"), verdict_line(result)
    first = opdiff.compare(str(silu), str(eager), str(tmp_path / "s"),
                           progress=False).first_divergence
    assert first is not None and first.name == "Module.model.layers.0.mlp.MistralMLP.forward.0"


_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {kit!r})
import opdiff
from compilekit import llama
model = llama()
run = torch.compile(model)
ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
if sys.argv[1] == "plain":
    run(ids, labels=ids).loss.backward()
else:
    with opdiff.dump(model, sys.argv[1], level="mix"):
        run(ids, labels=ids).loss.backward()
"""


def test_a_cache_warmed_without_opdiff_still_gives_kernels_their_modules(tmp_path):
    # two processes sharing a private Inductor cache: the user's script run plainly, then
    # recorded; while opdiff records, Inductor generates the wrapper again (caches off)
    script = tmp_path / "step.py"
    script.write_text(_SCRIPT.format(kit=str(Path(__file__).parent)))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(Path(opdiff.__file__).parents[1]),
                                                     os.environ.get("PYTHONPATH")) if p)}
    for arg in ("plain", str(tmp_path / "dump")):
        done = subprocess.run([sys.executable, str(script), arg], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert any((tmp_path / "cache").rglob("*")), "the plain run left nothing in its cache"
    kernels = [r for r in _records(tmp_path / "dump") if r["kind"] == "kernel"]
    assert kernels and all(r["compiled"].get("modules") is not None for r in kernels), [
        r["name"] for r in kernels if r["compiled"].get("modules") is None]
