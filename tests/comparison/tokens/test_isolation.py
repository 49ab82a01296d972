"""Same-input isolation (the verl-omni#637 table, automatic): a tiny HF Llama in bfloat16 against
a re-implementation that differs only in its RMSNorm's cast order (the weight multiplied in
float32, then cast to bfloat16, instead of cast first): fed golden's inputs, every op and module
call is bitwise equal except the five RMSNorm calls (about three quarters of their elements
equal, the rest one unit in the last place off), which the table names. Healthy: nothing named;
a 1% fault in one op: that op named, "differs"."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.comparison.isolation import DIFFERS, EQUAL, ROUNDING, isolate
from opdiff.errors import OpdiffError
from opdiff.testing import inject_fault

from tokenkit import SEQ, llama


def _cast_after(self, hidden_states):
    """LlamaRMSNorm's forward with the bf16 cast after the weight multiply."""
    dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight * hidden_states).to(dtype)


def _dump(path: Path, cast_after: bool = False, fault: str = "") -> Path:
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    model = llama().to(torch.bfloat16)
    draw = torch.Generator().manual_seed(3)
    for module in model.modules():      # (weights of one, the default, multiply exactly)
        if isinstance(module, modeling.LlamaRMSNorm):
            module.weight.data = (torch.rand(module.weight.shape, generator=draw) + 0.5
                                  ).to(torch.bfloat16)
    planted = inject_fault(op=fault.split(":")[0], call=int(fault.split(":")[1]),
                           scale=1.01) if fault else nullcontext()
    original = modeling.LlamaRMSNorm.forward
    if cast_after:
        modeling.LlamaRMSNorm.forward = _cast_after
    try:
        with planted, torch.no_grad(), opdiff.dump(model, str(path), level="mix", task="tensor"):
            model(input_ids=SEQ[None])
    finally:
        modeling.LlamaRMSNorm.forward = original
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolation")
    return {"golden": _dump(root / "golden"), "again": _dump(root / "again"),
            "cast": _dump(root / "cast", cast_after=True),
            "fault": _dump(root / "fault", fault="Functional.silu:1")}


def test_the_rmsnorm_cast_order_is_named_and_nothing_else(dumps):
    table = isolate(dumps["cast"], dumps["golden"])
    named = table.named
    assert [u.kind for u in named] == ["LlamaRMSNorm"] * 5
    assert {u.target.split(".")[-4] for u in named} == {"input_layernorm",
                                                          "post_attention_layernorm", "norm"}
    for u in named:
        assert u.verdict == ROUNDING and u.ulps == 1.0 and 0.5 < u.equal < 0.95
    # every op, and every module call without an RMSNorm in it, is bitwise equal
    others = [u for u in table.units if u.kind not in ("LlamaRMSNorm", "LlamaDecoderLayer",
                                                        "LlamaModel")]
    assert len(others) > 150 and all(u.verdict == EQUAL for u in others)
    assert "LlamaRMSNorm 0/5" in table.summary() and "Functional.linear 15/15" in table.summary()
    assert "Module.model.norm.LlamaRMSNorm.forward.0" in table.text()


def test_healthy_names_nothing(dumps):
    table = isolate(dumps["again"], dumps["golden"])
    assert table.named == [] and all(u.verdict == EQUAL for u in table.units)
    assert "every replayed unit is bitwise equal" in table.summary()


def test_a_faulty_op_is_named_not_its_modules(dumps):
    table = isolate(dumps["fault"], dumps["golden"])
    assert [(u.target, u.verdict) for u in table.named] == [("Functional.silu.1.forward",
                                                             DIFFERS)]


def test_statistics_dumps_are_refused_in_one_line(token_dump, dumps):
    with pytest.raises(OpdiffError, match="saved no tensors"):
        isolate(token_dump("alone", task="statistics"), dumps["golden"])


def test_cli_isolate(dumps, tmp_path):
    import subprocess
    import sys

    run = [sys.executable, "-m", "opdiff.cli", "isolate", str(dumps["cast"]),
           str(dumps["golden"]), "--named"]
    done = subprocess.run([*run, "--fail-on-divergence"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("Module.")]
    assert len(rows) == 5 and all("LlamaRMSNorm" in r for r in rows)
    assert "LlamaRMSNorm 0/5" in done.stdout
    done = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    done = subprocess.run([*run[:4], str(tmp_path / "nowhere"), str(dumps["golden"])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith("opdiff: error: ") and \
        done.stderr.count("\n") == 1
