"""Eager golden against `torch.compile` with Inductor on the CPU (the tiny Llama), level L2, a
fault in Inductor's BACKWARD: `aten.silu_backward` decomposed wrongly (x1.01, a compiler bug of
the pytorch#168126 kind in the compiled backward). Capture records the dataflow between the
compiled backward's calls, the compare pairs its extern kernels (the gradient `mm`s) with
eager's through the modules whose parameters they read, and each backward kernel becomes a small
region judged at its boundary, as forward kernels are: the kernel holding `silu_backward` is
named, in layer 1 (the first layer the backward runs). A healthy compiled step still names
nothing and is not inconclusive. Where a backward region cannot be judged and a tensor after it
differs beyond its tolerance, the answer is "inconclusive", never "no op is to blame"."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

import opdiff
from compilekit import Step, run_step, wrong_decomposition
from opdiff.comparison.regions import Region, unjudged_note
from opdiff.comparison.result import WARNING
from opdiff.report.console import verdict_line

TASKS = ["statistics", "tensor"]


def wrong_silu_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`aten.silu_backward` off by 1%."""
    s = torch.sigmoid(x)
    return grad * s * (1 + x * (1 - s)) * 1.01


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """The task's eager, healthy Inductor and wrong-backward Inductor steps, made once."""
    made: dict[tuple[str, str], Step] = {}

    def get(kind: str, task: str) -> Step:
        if (kind, task) not in made:
            path = tmp_path_factory.mktemp(kind) / task
            if kind == "eager":
                made[kind, task] = run_step(path, "L2", task=task)
            elif kind == "healthy":
                made[kind, task] = run_step(path, "L2", backend="inductor", task=task)
            else:
                with wrong_decomposition(torch.ops.aten.silu_backward.default,
                                         wrong_silu_backward):
                    made[kind, task] = run_step(path, "L2", backend="inductor", task=task)
        return made[kind, task]
    return get


def compare(steps, kind: str, task: str, out):
    return opdiff.compare(str(steps(kind, task).path), str(steps("eager", task).path),
                          str(out), progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_a_wrong_backward_decomposition_names_the_backward_kernel_holding_silu(tmp_path, steps,
                                                                              task):
    healthy = compare(steps, "healthy", task, tmp_path / "healthy")
    assert healthy.first_divergence is None, healthy.first_divergence
    assert not verdict_line(healthy).startswith("inconclusive"), verdict_line(healthy)
    # every backward region judged but the last (it hands its gradients to parameters only)
    unjudged = {r.region for r in healthy.rows if r.phase == "backward" and r.region
                and "not judged" in r.reason}
    assert len(unjudged) <= 1, unjudged
    # ... and said: a fault only there shows in no tensor L2 records
    said = [str(n) for n in healthy.notes if str(n).startswith("not judged: ")]
    assert len(said) == len(unjudged) and all(
        "embedding_dense_backward" in n and "level mix" in n for n in said), healthy.notes
    # the gradients the wrong backward made do differ
    grads = steps("bad", task).grads - steps("eager", task).grads
    assert grads.norm() / steps("eager", task).grads.norm() > 1e-4

    result = compare(steps, "bad", task, tmp_path / "bad")
    first = result.first_divergence
    assert first is not None and first.origin == "region", verdict_line(result)
    assert first.phase == "backward", first
    kernels = [op["op"] for op in first.region["target_ops"] if op["op"].startswith("Inductor.")]
    assert len(kernels) == 1 and "silu_backward" in kernels[0], first.region
    # golden's `silu_backward` runs after `up_proj`'s gradient `mm`s, and is listed in it
    assert "Aten.silu_backward" in [op["op"] for op in first.region["golden_ops"]], first.region
    # the kernel's first call: layer 1, the first layer the backward runs
    assert first.tensor is not None and \
        first.tensor.startswith(f"{kernels[0]}.0.backward.output"), first.tensor
    assert "`model.layers.1.mlp.act_fn`" in first.reason, first.reason
    assert "inputs agree" in first.reason or "inputs' statistics agree" in first.reason
    assert first.location is not None and first.location.file.endswith("modeling_llama.py")
    assert "act_fn" in (first.location.code or ""), first.location


@pytest.mark.slow
def test_a_wrong_backward_without_its_dataflow_is_inconclusive_not_agreement(tmp_path, steps):
    # a dump recorded before capture kept the compiled backward's dataflow (its calls' inputs
    # name no backward call that made them): its kernels' regions cannot be judged, and a
    # gradient `mm` after them differs beyond its tolerance: "inconclusive", naming them
    # (before: "no op is to blame: every difference is explained by the op's inputs ...")
    dump = tmp_path / "bad"
    shutil.copytree(steps("bad", "statistics").path, dump)
    records = dump / "step0" / "rank0" / "records.jsonl"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    backward = {r["seq"] for r in lines if r["phase"] == "backward"}
    for r in lines:
        for d in [*(r.get("inputs") or []), *(r.get("kwargs") or {}).values()]:
            if isinstance(d, dict) and (d.get("producer") or [None])[0] in backward:
                del d["producer"]
    records.write_text("".join(json.dumps(r) + "\n" for r in lines))
    result = opdiff.compare(str(dump), str(steps("eager", "statistics").path),
                            str(tmp_path / "out"), progress=False)
    line = verdict_line(result)
    assert result.first_divergence is None, result.first_divergence
    assert line.startswith("inconclusive: tensors differ, and region"), line
    assert re.search(r"`Inductor\.cpp_fused_\w*silu_backward\w*\.0\.backward`", line), line


class _Row:
    """The fields of a compare row `unjudged_note` reads."""

    def __init__(self, index: int, phase: str, kind: str = "aten") -> None:
        self.index, self.phase, self.kind = index, phase, kind
        self.result, self.accuracy_reached, self.region = WARNING, "No", None
        self.target_dtype = self.golden_dtype = "float32"
        self.error = 1e-3       # (beyond float32's tolerance, the run's precision)


def test_a_backward_op_beyond_tolerance_after_an_unjudged_backward_region_is_inconclusive():
    # a compiled run: backward op rows are evidence only after a backward region not judged
    # (a twin mispaired there makes the answer inconclusive, never a false agreement)
    region = Region(3, "backward", [10], [11], position=5, why="why it was not judged",
                    feeds_backward=True)
    after = unjudged_note([region], [], [_Row(7, "backward")], False, compiled=True)
    assert after is not None and after.startswith("inconclusive: tensors differ, and region 3")
    assert "why it was not judged" in after
    assert unjudged_note([region], [], [_Row(4, "backward")], False, compiled=True) is None
    forward = Region(3, "forward", [10], [11], position=5)
    assert unjudged_note([forward], [], [_Row(7, "backward")], False, compiled=True) is None
    # (aot_eager's backward, or a kernel whose results no recorded op reads: not evidence)
    ends = Region(3, "backward", [10], [11], position=5)
    assert unjudged_note([ends], [], [_Row(7, "backward")], False, compiled=True) is None


@pytest.mark.slow
def test_inductor_backward_calls_name_no_forward_op_of_the_compiled_function(steps):
    # an extern kernel of the compiled backward runs under the compiled function's autograd
    # node, whose number names the first op its forward ran (before: every one of them said
    # `forward: Aten.mm.0.forward`, and a replay could take it for that op's backward)
    path = steps("healthy", "statistics").path / "step0" / "rank0" / "records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    calls = [r for r in records if r["phase"] == "backward" and r["kind"] == "aten"
             and r.get("autograd_node") == "CompiledFunctionBackward"]
    assert len(calls) > 20, len(calls)
    assert not [r["name"] for r in calls if r.get("forward")], [
        (r["name"], r["forward"]) for r in calls if r.get("forward")][:3]
