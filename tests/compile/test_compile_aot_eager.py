"""Eager golden against `torch.compile(backend="aot_eager")` target, one training step of a
tiny Llama (steps: tests/compile/conftest.py): capture changes nothing in the compiled step,
records what the compiled graphs run with the compiler's provenance, a healthy pair names
nothing, a wrong CPU kernel of silu in one layer is named there, and where the two sides are
recorded unlike each other the answer is "inconclusive", not a refusal."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff
from opdiff.report.console import verdict_line

AOT = "aot_eager"


def _records(step) -> list[dict]:
    path = step.path / "step0" / "rank0" / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _compare(target, golden, tmp_path):
    return opdiff.compare(str(target.path), str(golden.path), str(tmp_path / "out"),
                          progress=False)


@pytest.mark.parametrize("level", ["L2", "mix"])
def test_capture_adds_no_graph_break_and_keeps_the_step_bitwise(compiled_step, level):
    plain = compiled_step(None, AOT)
    captured = compiled_step(level, AOT)
    assert torch.equal(plain.loss, captured.loss)
    assert torch.equal(plain.grads, captured.grads)
    assert not captured.counters.get("graph_break"), captured.counters
    assert not captured.counters.get("recompiles"), captured.counters
    assert captured.counters["stats"]["unique_graphs"] == plain.counters["stats"]["unique_graphs"]
    assert captured.counters["stats"]["calls_captured"] == \
        plain.counters["stats"]["calls_captured"]


def test_compiled_graph_ops_carry_the_compilers_provenance(compiled_step):
    records = _records(compiled_step("L2", AOT))
    silu = [r for r in records if r["op"] == "Aten.silu" and r["phase"] == "forward"]
    assert [r["compiled"]["module"] for r in silu] == \
        [f"model.layers.{i}.mlp.act_fn" for i in range(len(silu))]
    assert all(r["compiled"]["source"][0].endswith("activations.py") for r in silu)  # nn.SiLU
    backward = [r for r in records if r["phase"] == "backward" and r.get("kind") == "aten"]
    assert backward
    # (AOT's runtime fills the gradients of outputs that got none with zeros, outside the graph)
    assert {r["op"] for r in backward if not r.get("compiled")} <= {"Aten.zeros"}
    # a compiled backward op names its forward op through the graph node's seq_nr
    silu_backward = [r for r in backward if r["op"] == "Aten.silu_backward"]
    assert {r["forward"] for r in silu_backward} == {r["name"] for r in silu}
    eager = _records(compiled_step("L2"))
    assert not any(r.get("compiled") for r in eager)


TASKS = ["statistics", pytest.param("tensor", marks=pytest.mark.slow)]


@pytest.mark.parametrize("task", TASKS)
def test_a_healthy_pair_names_nothing_at_L2(compiled_step, tmp_path, task):
    result = _compare(compiled_step("L2", AOT, task=task), compiled_step("L2", task=task),
                      tmp_path)
    assert result.first_divergence is None, result.first_divergence
    assert result.coverage is not None and result.coverage > 0.8
    assert not [n for n in result.notes if n.startswith("inconclusive")]
    assert result.counts["error"] == 0


def test_a_healthy_pair_at_mix_is_inconclusive_not_refused(compiled_step, tmp_path):
    result = _compare(compiled_step("mix", AOT), compiled_step("mix"), tmp_path)
    assert result.first_divergence is None, result.first_divergence
    line = verdict_line(result)
    assert line.startswith("inconclusive: the target ran torch.compile'd code"), line
    assert 'level="L2"' in line
    grads = [r for r in result.rows if r.kind == "param_grad"]
    assert grads and all(r.result == "pass" for r in grads)


@pytest.mark.parametrize("task", TASKS)
def test_a_wrong_silu_kernel_is_named_at_that_op_and_layer(compiled_step, tmp_path, task):
    result = _compare(compiled_step("L2", AOT, "silu:1", task), compiled_step("L2", task=task),
                      tmp_path)
    first = result.first_divergence
    assert first is not None, verdict_line(result)
    assert first.name == "Aten.silu.1.forward", first
    assert first.origin == "op"
    assert "`model.layers.1.mlp.act_fn`" in first.reason
    assert first.location is not None and first.location.file.endswith("activations.py")


def test_a_wrong_kernel_at_mix_blames_no_innocent_op(compiled_step, tmp_path):
    result = _compare(compiled_step("mix", AOT, "silu:1"), compiled_step("mix"), tmp_path)
    assert result.first_divergence is None, result.first_divergence
    assert verdict_line(result).startswith("inconclusive:")
    assert any(r.result != "pass" for r in result.rows if r.kind == "param_grad")
