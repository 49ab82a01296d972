"""Eager golden against `torch.compile(backend="aot_eager")` target, one training step of a
tiny Llama (steps: tests/compile/conftest.py): capture changes nothing in the compiled step,
records what the compiled graphs run with the compiler's provenance, a healthy pair names
nothing, a wrong CPU kernel of silu in one layer is named there, and where the two sides are
recorded unlike each other (mix: torch calls against compiled aten ops) each module call is
judged at its boundary."""
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


def test_a_graph_compiled_again_names_its_own_nodes(tmp_path):
    # the same model compiled twice in one process generates graphs of the same code (code
    # objects compare equal whatever their file): each graph's ops must carry its own nodes'
    # facts, not the first graph's (whose seq_nr linked no backward op to its forward op)
    from compilekit import run_step
    run_step(tmp_path / "first", "mix", AOT)
    records = _records(run_step(tmp_path / "again", "L2", AOT))
    backward = [r for r in records if r["phase"] == "backward" and r.get("compiled")]
    linked = [r for r in backward if r.get("forward")]
    assert backward and len(linked) > len(backward) / 2, (len(linked), len(backward))
    silu = [r["name"] for r in records if r["op"] == "Aten.silu" and r["phase"] == "forward"]
    assert {r["forward"] for r in backward if r["op"] == "Aten.silu_backward"} == set(silu)


TASKS = ["statistics", pytest.param("tensor", marks=pytest.mark.slow)]


@pytest.mark.parametrize("task", TASKS)
def test_a_healthy_pair_names_nothing_at_L2(compiled_step, tmp_path, task):
    result = _compare(compiled_step("L2", AOT, task=task), compiled_step("L2", task=task),
                      tmp_path)
    assert result.first_divergence is None, result.first_divergence
    assert result.coverage is not None and result.coverage > 0.8
    assert not [n for n in result.notes if n.startswith("inconclusive")]
    assert result.counts["error"] == 0


def test_a_healthy_pair_at_mix_names_nothing_through_module_boundaries(compiled_step, tmp_path):
    """At mix the compiled ops never pair with eager torch calls; each module call whose
    boundary the dataflow proves is judged there (comparison/compiled_modules.py)."""
    result = _compare(compiled_step("mix", AOT), compiled_step("mix"), tmp_path)
    assert result.first_divergence is None, result.first_divergence
    assert not [n for n in result.notes if n.startswith("inconclusive")], result.notes
    judged = {r.op_name for r in result.rows if r.kind == "module" and r.result == "pass"}
    assert {f"Module.model.layers.{i}.mlp.LlamaMLP.forward.0" for i in range(2)} <= judged
    assert len(judged) >= 10, sorted(judged)
    grads = [r for r in result.rows if r.kind == "param_grad"]
    assert grads and all(r.result == "pass" for r in grads)
    assert result.counts["error"] == 0


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


@pytest.mark.parametrize("task", TASKS)
def test_a_wrong_silu_backward_kernel_is_named_at_that_op_and_layer(compiled_step, tmp_path,
                                                                     task):
    # the compiled backward graph's ops pair with eager's through their forward op; backward
    # runs the layers in reverse, so silu_backward's second call is layer 0's
    result = _compare(compiled_step("L2", AOT, "silu_backward:1", task),
                      compiled_step("L2", task=task), tmp_path)
    first = result.first_divergence
    assert first is not None, verdict_line(result)
    assert (first.name, first.phase, first.origin) == \
        ("Aten.silu_backward.1.backward", "backward", "op"), first
    assert "`model.layers.0.mlp.act_fn`" in first.reason
    assert first.location is not None and first.location.file.endswith("activations.py")
    # nothing before it in the backward is an error: the fault is local to that call
    errors = {r.op_name for r in result.rows if r.result == "error" and r.role == "output"
              and r.phase == "backward"}
    assert "Aten.silu_backward.0.backward" not in errors, errors


def test_a_wrong_kernel_at_mix_is_named_at_its_module_call(compiled_step, tmp_path):
    result = _compare(compiled_step("mix", AOT, "silu:1"), compiled_step("mix"), tmp_path)
    first = result.first_divergence
    assert first is not None, verdict_line(result)
    assert first.name == "Module.model.layers.1.mlp.act_fn.SiLUActivation.forward.0", first
    assert "`model.layers.1.mlp.act_fn`" in first.reason, first.reason
    assert first.location is not None and first.location.file.endswith("activations.py")
    # no module call before it, nor of layer 0, is named
    errors = {r.op_name for r in result.rows if r.kind == "module" and r.result == "error"}
    assert not [n for n in errors if "layers.0" in n], errors


def test_a_module_call_is_judged_only_where_its_boundary_is_proven(compiled_step):
    from opdiff.comparison.compiled_modules import module_calls
    from opdiff.store.schema import complete

    target = [complete(r) for r in _records(compiled_step("mix", AOT))]
    golden = [complete(r) for r in _records(compiled_step("mix"))]
    act = "Module.model.layers.1.mlp.act_fn.SiLUActivation.forward.0"

    def judged(records):
        return {r["name"] for r in module_calls(records, golden) if r["kind"] == "module"}
    assert act in judged(target)
    silu = next(i for i, r in enumerate(target) if r["op"] == "Torch.silu.default"
                and r["compiled"]["module"] == "model.layers.1.mlp.act_fn")
    # an input whose maker is unknown: the boundary is not proven
    unknown = dict(target[silu], inputs=[{k: v for k, v in d.items() if k != "producer"}
                                         for d in target[silu]["inputs"]])
    assert act not in judged(target[:silu] + [unknown] + target[silu + 1:])
    # a random op inside (dropout in training draws other numbers than eager)
    drawn = dict(target[silu], op="Torch.native_dropout.default")
    assert act not in judged(target[:silu] + [drawn] + target[silu + 1:])
