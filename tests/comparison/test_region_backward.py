"""A backward region judged through its forward calls' dataflow (comparison/region_gradients.py).

A bare attention block (regionkit.Block: q/k/v projections, SDPA on the target side, eager
`matmul -> softmax -> matmul` on the golden one) on an input that needs no gradient: the
attention module call hands back no gradient, so its module boundary cannot judge the backward
region; the gradients SDPA's backward receives (from the paired `transpose` after it) and hands
back (to the paired `transpose`s that made q, k, v) can. Faults are planted below the recorder
in SDPA's backward (its input gradients scaled by 1.02)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.comparison.rejudge import rejudge
from opdiff.report.summary import load_summary

from regionkit import Attention, Block, block_dump, without_dataflow

SDPA = "Functional.scaled_dot_product_attention"


class SharedValue(Attention):
    """The attention block with v also added to the attention's output: v's gradient is the
    sum of the attention's and the addition's."""

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, 2, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.fused:
            h = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            w = torch.matmul(q, k.transpose(-2, -1)) / 8 ** 0.5
            h = torch.matmul(torch.softmax(w, dim=-1), v)
        return self.o((h + v).transpose(1, 2).reshape(b, t, 16))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("region_backward")
    made: dict[tuple, Path] = {}

    def get(name: str, task: str) -> Path:
        if (name, task) not in made:
            fused = name != "eager" and name != "shared_eager"
            fault = "Functional.linear" if name.startswith("q_") else SDPA if "bad" in name \
                else None
            attention = SharedValue if name.startswith("shared") else Attention
            phase = "forward" if name.endswith("forward") else "backward"
            made[(name, task)] = block_dump(root / f"{name}_{task}", fused, fault=fault,
                                            phase=phase, task=task,
                                            make=lambda f: Block(f, attention))
        return made[(name, task)]
    return get


def _regions(result) -> dict:
    """The regions judged, by name (`facts.RegionFacts`, saved in summary.json)."""
    return {region.name: region for facts in result.facts for region in facts.regions}


def _backward_region(result) -> str:
    (name,) = {name for name in _regions(result) if name.endswith(".backward")}
    return name


def _boundary(result, name: str) -> list:
    """The rows a region's inputs and outputs were measured by."""
    region = _regions(result)[name]
    names = {*region.inputs, *region.outputs}
    return [r for r in result.rows if r.target_name in names]


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_healthy_sdpa_backward_is_judged_and_names_nothing(dumps, task):
    result = opdiff.compare(dumps("sdpa", task), dumps("eager", task), progress=False)
    assert result.first_divergence is None
    assert not [n for n in result.notes if n.startswith("inconclusive")], result.notes
    backward = [r for r in result.rows if r.region and r.phase == "backward"]
    assert backward and all(r.result == "pass" and "not judged" not in r.reason
                            for r in backward), backward
    # its boundary: the gradient SDPA receives, as the paired transpose after it hands it back;
    # the gradients of q, k, v, where the paired transposes that made them receive them; and,
    # as for an op's backward, what its forward call read and made (q, k, v where they were
    # made, its output where the transpose after it reads it)
    region = _backward_region(result)
    found = _regions(result)[region]
    marked = {**{t: "in" for t in found.inputs}, **{t: "out" for t in found.outputs}}
    assert marked == {"Tensor.transpose.0.forward.output.0": "in",
                      "Tensor.transpose.1.forward.output.0": "in",
                      "Tensor.transpose.2.forward.output.0": "in",
                      "Tensor.transpose.3.forward.input.0": "in",
                      "Tensor.transpose.3.backward.output.0": "in",
                      "Tensor.transpose.0.backward.input.0": "out",
                      "Tensor.transpose.1.backward.input.0": "out",
                      "Tensor.transpose.2.backward.input.0": "out"}


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_2pct_fault_in_sdpa_backward_names_the_backward_region(dumps, task):
    result = opdiff.compare(dumps("sdpa_bad", task), dumps("eager", task), progress=False)
    first = result.first_divergence
    assert first is not None and first.origin == "region" and first.phase == "backward", first
    assert first.reason.startswith("region in `attn` (backward; target: "
                                   f"`{SDPA}` at "), first.reason
    assert [o["op"] for o in first.region["target_ops"]] == [SDPA]
    assert {o["op"] for o in first.region["golden_ops"]} >= {"Torch.matmul", "Torch.softmax"}
    # the gradient entering it is named as SDPA receives it, with what its forward call read
    # and made, and all agree
    assert [(i["name"], i["op"], i["agrees"]) for i in first.region["inputs"]] == \
        [(name, SDPA, True) for name in ("query", "key", "value", "output", "grad_output")]
    assert f"`query`, `key`, `value`, `output`, `grad_output` of `{SDPA}`" in first.reason
    assert "local error in this region" in first.reason
    if task == "tensor":
        # the worst gradient is SDPA's own, replayed as the VJP of its forward call
        assert first.tensor.startswith(f"{SDPA}.0.backward.output."), first.tensor
        assert "the region's own gradient error is 0.0196" in first.reason, first.reason
    errors = [r for r in result.rows if r.result == "error"]
    assert errors and all("region" in r.reason for r in errors), errors


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_in_q_is_not_blamed_on_the_backward_region(dumps, task):
    # q differs by 2%: SDPA's gradients differ with it although the gradient it receives
    # agrees; what its forward call read counts as its input, as for an op's backward
    result = opdiff.compare(dumps("q_bad_forward", task), dumps("eager", task), progress=False,
                            replay="off")
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Functional.linear.0.forward"
    region = _backward_region(result)
    boundary = _boundary(result, region)
    assert any(r.result != "pass" for r in boundary)        # the difference reaches it
    assert not [r for r in result.rows if "local error in this region" in (r.reason or "")]


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_gradient_summed_outside_the_region_leaves_it_unjudged_and_says_why(dumps, task):
    # v's gradient is the attention's plus the addition's: the region's share of it is not
    # recorded anywhere, and the attention module hands back no gradient
    healthy = opdiff.compare(dumps("shared", task), dumps("shared_eager", task), progress=False)
    assert healthy.first_divergence is None
    faulty = opdiff.compare(dumps("shared_bad", task), dumps("shared_eager", task),
                            progress=False)
    assert faulty.first_divergence is None         # never an innocent op
    (note,) = [n for n in faulty.notes if n.startswith("inconclusive")]
    assert "\n" not in note
    assert ("`Tensor.transpose.2.forward.output.0` is read inside it and outside it "
            "(`Tensor.__add__.0.forward`)") in note, note
    assert "its module call `attn` hands back no gradient (its inputs need none)" in note, note
    backward = [r for r in faulty.rows if r.region and r.phase == "backward"]
    assert backward and all("is read inside it and outside it" in r.reason and
                            r.reason.endswith("not judged") for r in backward), backward


class GainedBlock(Block):
    """The block on its input times a learned gain: the attention module's backward hands
    back its input's gradient, so a backward region can be judged at that module call."""

    def __init__(self, fused: bool) -> None:
        super().__init__(fused)
        self.gain = torch.nn.Parameter(torch.full((16,), 1.5))

    def forward(self, x):
        return super().forward(x * self.gain)


def _bare(tmp_path: Path, name: str, fused: bool, task: str, fault=None,
          phase: str = "forward") -> Path:
    """A GainedBlock dump with its dataflow (`producer`) stripped, as older or foreign dumps."""
    made = block_dump(tmp_path / name, fused, fault=fault, phase=phase, task=task,
                      make=GainedBlock)
    return without_dataflow(made, tmp_path / f"{name}_bare")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_at_a_module_boundary_a_fault_in_q_is_not_blamed_on_the_backward_region(tmp_path, task):
    # without dataflow the backward region's boundary is the attention module's backward call:
    # the gradient it receives agrees and the one it hands back differs, because q (its
    # forward's work, before the region) differs: its forward call's tensors count as its
    # inputs, as an op's backward is judged with its forward call's
    def dump(name: str, fused: bool, fault=None) -> Path:
        return _bare(tmp_path, name, fused, task, fault)
    golden = dump("eager", False)
    healthy = opdiff.compare(dump("sdpa", True), golden, progress=False, replay="off")
    assert healthy.first_divergence is None
    assert [r for r in healthy.rows if r.region and r.phase == "backward"]
    assert _backward_region(healthy)
    result = opdiff.compare(dump("q_bad", True, "Functional.linear"), golden, progress=False,
                            replay="off")
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Functional.linear.0.forward"
    region = _backward_region(result)
    boundary = _boundary(result, region)
    assert _regions(result)[region].how == "module" and _regions(result)[region].module
    assert any(r.result != "pass" for r in boundary)        # the difference reaches it
    backward = [r for r in result.rows if r.region and r.phase == "backward"]
    assert backward and not [r for r in backward if "local error" in r.reason], backward
    (label,) = {r.region for r in backward}
    assert not [r for r in result.rows if f"the output of {label}: local error" in r.reason]
    # a fault in SDPA's own backward is still named there, its forward's tensors agreeing
    first = opdiff.compare(_bare(tmp_path, "sdpa_bad", True, task, SDPA, "backward"), golden,
                           progress=False, replay="off").first_divergence
    assert first is not None and first.origin == "region" and first.phase == "backward", first


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_at_a_module_boundary_a_fault_in_q_is_not_blamed_on_the_forward_region(tmp_path, task):
    # without dataflow the forward region's boundary is the attention module call: its input
    # agrees and its output differs, because q's projection, a paired op inside that call that
    # ran before the region, differs: the outputs of such ops count as the region's inputs
    def dump(name: str, fused: bool, fault=None) -> Path:
        return _bare(tmp_path, name, fused, task, fault)
    golden = dump("eager", False)
    result = opdiff.compare(dump("q_bad", True, "Functional.linear"), golden, progress=False,
                            replay="off")
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Functional.linear.0.forward"
    forward = [r for r in result.rows if r.region and r.phase == "forward"]
    assert forward and not [r for r in forward if "not judged" in r.reason], forward
    assert not [r for r in forward if "local error" in r.reason], forward
    (label,) = {r.region for r in forward}
    assert not [r for r in result.rows if f"the output of {label}: local error" in r.reason]
    # its boundary: the module call's, with q's, k's and v's projections among its inputs
    (region,) = {r for name, r in _regions(result).items() if name.endswith(".forward")}
    marked = set(region.inputs)
    assert {f"Functional.linear.{i}.forward.output.0" for i in range(3)} <= marked, marked
    # a fault in SDPA itself is still named at the region, what ran before it agreeing
    first = opdiff.compare(dump("sdpa_bad", True, SDPA), golden, progress=False,
                           replay="off").first_divergence
    assert first is not None and first.origin == "region" and first.phase == "forward", first
    assert "local error in this region" in first.reason, first.reason


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_rejudged_region_reads_as_the_compare(dumps, tmp_path, task, phase):
    """rejudge reads no dump: the region's sentence, its inputs' names (`query`, `key`,
    `value`; `grad_output`), the tensor it made and its module come back from the rows' marks
    (comparison/region_facts.py), from the result and from its files alike."""
    name = "sdpa_bad" if phase == "backward" else "sdpa_bad_forward"
    original = opdiff.compare(dumps(name, task), dumps("eager", task), tmp_path / "out",
                              progress=False, replay="off")
    first = original.first_divergence
    assert first is not None and first.origin == "region" and first.phase == phase, first
    names = [i["name"] for i in first.region["inputs"]]
    assert names == ["query", "key", "value"] + ([] if phase == "forward" else
                                                 ["output", "grad_output"])
    assert first.tensor.startswith(f"{SDPA}.0.{phase}.output.")
    loose = {"tolerance": {"fp32": 0.005}}
    for again in (rejudge(original, loose), rejudge(load_summary(original.files["summary"]),
                                                    loose)):
        found = again.first_divergence
        assert found is not None
        assert (found.name, found.reason, found.region, found.tensor, found.module) == \
            (first.name, first.reason, first.region, first.tensor, first.module)
