"""`opdiff check` on a tensor dump of a `torch.compile(backend="aot_eager")` training step (tiny
Llama, steps: conftest.py): each aten op the compiled graphs ran, forward and backward graphs,
is judged against its float64 replay. A healthy step has no failure and nothing left
unchecked (the graphs' factory calls pass `layout=torch.strided`); a wrong CPU kernel of silu
in its second call is the one failure, named with the module and line the compiler gives."""
from __future__ import annotations

from opdiff.check import check_dump

AOT = "aot_eager"


def _check(step):
    return check_dump(step.path / "step0" / "rank0")


def test_a_healthy_compiled_tensor_dump_has_no_failure(compiled_step):
    result = _check(compiled_step("L2", AOT, task="tensor"))
    assert result.first_failure is None, result.first_failure
    assert len(result.checked) > 300
    assert not result.not_checked, [(o.name, o.reason) for o in result.not_checked][:5]
    backward = [o for o in result.checked if o.phase == "backward"]
    assert backward     # the compiled backward graph's ops are judged too


def test_a_wrong_cpu_kernel_in_a_compiled_graph_is_named(compiled_step):
    result = _check(compiled_step("L2", AOT, "silu:1", "tensor"))
    assert [o.name for o in result.failures] == ["Aten.silu.1.forward"]
    first = result.first_failure
    assert first.module == "model.layers.1.mlp.act_fn"
    assert first.location is not None and first.location.file.endswith("activations.py")
