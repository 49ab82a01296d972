"""With tensor dumps a region is judged on its own error by replay, as a replayed op is: its
target ops re-run as a chain from its saved inputs in float64 and in their own dtypes
(`opdiff.comparison.replay.chain`). Llama, fp32 eager golden against bf16-autocast SDPA
(dumps: tests/comparison/conftest.py)."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff
from opdiff import schemas

SDPA = "Functional.scaled_dot_product_attention"


def _compare(hf_dump, tmp_path, fault=None, noise=0.0, replay="auto", thresholds=None):
    golden = hf_dump("llama", "eager", "tensor")
    target = hf_dump("llama", "sdpa", "tensor", fault=fault, bf16=True, noise=noise)
    return opdiff.compare(str(target), str(golden), str(tmp_path / "out"), progress=False,
                          replay=replay, thresholds=thresholds)


def _chained(result):
    return [r for r in result.rows if r.region and "; replayed as a chain" in (r.reason or "")]


def test_healthy_bf16_sdpa_regions_are_replayed_and_cleared(hf_dump, tmp_path):
    result = _compare(hf_dump, tmp_path)
    assert result.first_divergence is None, result.first_divergence
    cleared = _chained(result)
    # both layers' attention regions, and the backward of the loss's `logits.float()` that
    # only the bf16 run has (a region of its op alone, region_onesided.py): within what bf16
    # makes, any difference inherited
    assert {r.region.split(" in ")[-1] for r in cleared} == {"model.layers.0.self_attn",
                                                            "model.layers.1.self_attn",
                                                            "region 4"}
    assert {r.op_name for r in cleared if r.region == "region 4"} == {"Tensor.float.1.backward"}
    assert all("its own error is its dtypes'" in r.reason for r in cleared)
    # forward and backward attention regions of both layers (a backward region through its
    # forward calls' vector-Jacobian product: replay/backchain.py), and the cast's; eager's
    # `.contiguous()` backwards, regions of golden's ops alone, have nothing to replay
    assert any("5 region(s) replayed as chains" in n for n in result.notes), result.notes
    backward = [r for r in result.rows if r.region and r.phase == "backward"
                and int(r.region.split()[1]) < 4]       # (one-sided ones come after)
    assert {r.region.split(" in ")[-1] for r in backward} == {"model.layers.0.self_attn",
                                                             "model.layers.1.self_attn"}
    assert all("(a vector-Jacobian product)" in r.reason and
               "its own error is its dtypes'" in r.reason for r in backward), backward


def test_a_healthy_region_the_comparison_blames_is_cleared_by_its_chain(hf_dump, tmp_path):
    """Thresholds strict enough that the comparison blames the healthy bf16 attention (its
    output error, 0.0034, above its inputs' 0.003): replayed as a chain, the region's own error
    is what rounding to bf16 makes, so it is cleared like a replayed op, and its rows say so."""
    strict = {"amplification": 1.0, "tolerance": {"bf16": 2e-3}}
    blamed = _compare(hf_dump, tmp_path / "off", replay="off", thresholds=strict)
    assert any("the output of region 0 in model.layers.0.self_attn: local error" in (r.reason or "")
               for r in blamed.rows if r.result == "error")
    result = _compare(hf_dump, tmp_path, thresholds=strict)
    assert result.first_divergence is None, result.first_divergence
    assert not [r for r in result.rows if r.result == "error"]
    cleared = [r for r in _chained(result) if "model.layers.0.self_attn" in r.region]
    assert cleared and all("any difference is inherited" in r.reason for r in cleared)


def test_a_2pct_fault_in_sdpa_is_confirmed_by_the_chain(hf_dump, tmp_path):
    result = _compare(hf_dump, tmp_path, fault=f"{SDPA}:1")
    first = result.first_divergence
    assert first is not None and first.origin == "region", first
    assert "region in `model.layers.1.self_attn`" in first.reason
    assert first.region["target_ops"][0]["op"] == SDPA
    assert "replayed as a chain of its 2 target op(s) in float64" in first.reason
    assert "scaled by 1.02" in first.reason
    assert first.kind == "scale"        # the comparison's culprit, confirmed by the chain
    assert any("region(s) replayed as chains" in n for n in result.notes), result.notes


@pytest.mark.parametrize("call, layer", [(0, 0), (1, 1)])
def test_a_1pct_noise_fault_only_the_chain_replay_finds(hf_dump, tmp_path, call, layer):
    """A kernel off by 1% elementwise: against fp32 golden its output error is that of bf16
    accumulation (the comparison cannot separate them: without replay, nothing is named);
    replayed from the region's own inputs it stands out against a bf16 chain's error."""
    unreplayed = _compare(hf_dump, tmp_path / "off", fault=f"{SDPA}:{call}", noise=0.01,
                          replay="off")
    assert unreplayed.first_divergence is None, unreplayed.first_divergence
    result = _compare(hf_dump, tmp_path, fault=f"{SDPA}:{call}", noise=0.01)
    first = result.first_divergence
    assert first is not None and first.origin == "region", first
    assert first.kind == "replay"
    assert f"region in `model.layers.{layer}.self_attn`" in first.reason
    assert first.region["target_ops"][0]["op"] == SDPA
    assert "compared with golden its error is not distinguishable" in first.reason
    assert "the same ops on the CPU in their own dtypes (bfloat16" in first.reason
    assert first.tensor and first.tensor.startswith("Tensor.reshape.")   # what the region made
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"]["kind"] == "replay"
    schemas.validate("compare-summary", summary)
    errors = [r for r in result.rows if r.result == "error"]
    assert errors and all(f"model.layers.{layer}.self_attn" in (r.reason or "") or
                          "region" in (r.reason or "") for r in errors), errors


@pytest.fixture(scope="module")
def backward_fault(tmp_path_factory):
    """SDPA's gradients w.r.t. its inputs scaled by 1.02 in layer 1; its forward is healthy."""
    from regionkit import make_dump

    made = {}

    def get(family):
        if family not in made:
            made[family] = make_dump(tmp_path_factory.mktemp("backchain") / family, family,
                                     "sdpa", "tensor", fault=f"{SDPA}:1", bf16=True,
                                     phase="backward")
        return made[family]
    return get


@pytest.mark.parametrize("family, layer", [("llama", "model.layers.1.self_attn"),
                                           ("gpt2", "transformer.h.1.attn")])
def test_a_2pct_fault_in_sdpa_backward_is_named_by_the_backward_chain(hf_dump, backward_fault,
                                                                      tmp_path, family, layer):
    """Against fp32 eager golden the region's gradient error is not told apart from what its
    inputs carry (without the backward replay nothing is named); replayed as the vector-Jacobian
    product of its forward calls from its own saved inputs, the 2% stands out."""
    golden = hf_dump(family, "eager", "tensor")
    result = opdiff.compare(str(backward_fault(family)), str(golden), str(tmp_path / "out"),
                            progress=False)
    first = result.first_divergence
    assert first is not None and first.origin == "region", first
    assert first.phase == "backward" and first.kind == "replay", first
    assert f"region in `{layer}` (backward;" in first.reason, first.reason
    assert SDPA in [o["op"] for o in first.region["target_ops"]]
    assert "(a vector-Jacobian product), the region's own gradient error is 0.02" in \
        first.reason, first.reason
    assert "scaled by 1.02" in first.reason
    assert f"{SDPA}.1.backward.output." in first.reason    # the worst gradient, by name
    errors = [r for r in result.rows if r.result == "error"]
    assert errors and all(layer in (r.reason or "") for r in errors), errors


class _Activation(torch.nn.Module):
    """gelu ("exact"), its sigmoid approximation `x * sigmoid(1.702 x)` ("approx"), or that
    approximation through torch.special.expit ("spelled")."""

    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate
        self.a, self.b = torch.nn.Linear(12, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x)
        if self.approximate == "approx":
            h = h * torch.sigmoid(1.702 * h)
        elif self.approximate == "spelled":
            h = h * torch.special.expit(1.702 * h)
        else:
            h = torch.nn.functional.gelu(h)
        return self.b(h)


def _activation_dump(path, approximate: str):
    torch.manual_seed(0)
    model = _Activation(approximate)
    with opdiff.dump(model, str(path), level="mix", task="tensor"):
        model(torch.randn(8, 12)).pow(2).mean().backward()
    return str(path)


def test_a_region_whose_ops_compute_another_function_stays_blamed_after_its_replay(tmp_path):
    # the chain replay re-runs the target's `x * sigmoid(1.702 x)` exactly (own error 6e-8):
    # its arithmetic is right, but it is not golden's gelu (1% apart on inputs that agree);
    # the replay cleared the region and the verdict was "no op is to blame"
    target = _activation_dump(tmp_path / "approx", "approx")
    golden = _activation_dump(tmp_path / "exact", "exact")
    result = opdiff.compare(target, golden, progress=False)
    first = result.first_divergence
    assert first is not None and first.origin == "region" and first.phase == "forward", result.verdict
    assert [o["op"] for o in first.region["golden_ops"]] == ["Functional.gelu"]
    assert "they compute something else than golden's ops" in first.reason, first.reason
    # other ops computing the same function: a region, and nothing to blame
    same = opdiff.compare(target, _activation_dump(tmp_path / "spelled", "spelled"), progress=False)
    assert same.first_divergence is None, same.verdict
    assert any(r.region for r in same.rows), "the runs were meant to execute different ops"
