"""`opdiff check` on a compiled tensor dump judges each Inductor kernel against its float64
replay: capture stores with each C++ kernel the aten ops it fuses as a small program over its
arguments (capture/kernel_programs.py), check replays it from the saved inputs in float64 and in
its own dtypes (comparison/replay/kernels.py) and judges the kernel as it judges an op. A
healthy compiled tiny Llama (forward and backward) passes, bitwise as without opdiff; a wrong
Inductor decomposition of `aten.silu` fails at the kernel holding that silu, in the first layer,
at the model's line."""
from __future__ import annotations

import pytest
import torch

from compilekit import fresh_compile, run_step, wrong_silu_decomposition
from opdiff import schemas
from opdiff.check import check_dump
from opdiff.store.reader import open_dump


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    with fresh_compile():
        plain = run_step(None, backend="inductor")
        target = run_step(tmp_path_factory.mktemp("inductor") / "d", "L2", backend="inductor",
                          task="tensor")
    return plain, target


def _records(path):
    return list(open_dump(str(path / "step0" / "rank0")).records())


def _kernels(result):
    return [op for op in result.ops if op.name.startswith("Inductor.")]


@pytest.mark.slow
def test_healthy_kernels_pass_and_count_as_checked(healthy):
    plain, target = healthy
    # generating the programs changes nothing that is compiled or run
    assert torch.equal(plain.loss, target.loss) and torch.equal(plain.grads, target.grads)
    assert not target.counters.get("graph_break"), target.counters
    records = list(open_dump(str(target.path / "step0" / "rank0")).records())
    for rec in records:
        if rec["kind"] == "kernel":
            schemas.validate("dump-record", rec)
    assert sum("steps" in rec.get("program", {}) for rec in records) >= 20
    result = check_dump(target.path / "step0" / "rank0")
    kernels = _kernels(result)
    passed = [op for op in kernels if op.status == "pass"]
    assert not result.failures, [(op.name, op.reason) for op in result.failures[:3]]
    assert {op.phase for op in passed} == {"forward", "backward"}
    # (the embedding's gradient, accumulated in place into zeros, is left out of its kernel)
    assert len(passed) == len(kernels) and len(kernels) >= 20, (len(passed), len(kernels))
    assert all(op in result.checked for op in passed)
    for op in kernels:
        if op.status == "not_checked":      # one line saying which and why
            assert op.reason.startswith("a kernel Inductor generated: ") and "\n" not in op.reason
    silu = next(op for op in passed if "silu" in op.name and op.phase == "forward")
    assert silu.reference.startswith("CPU chain of its fused aten ops") and silu.outputs
    assert all(o.reference_error > 0 and o.error < 10 * o.reference_error for o in silu.outputs)


@pytest.mark.slow
def test_wrong_silu_decomposition_fails_the_kernel_holding_silu(tmp_path):
    with wrong_silu_decomposition():
        target = run_step(tmp_path / "inductor", "L2", backend="inductor", task="tensor")
    result = check_dump(target.path / "step0" / "rank0")
    first = result.first_failure
    assert first is not None and first.name.startswith("Inductor.") and "silu" in first.name
    assert first.name.endswith(".0.forward"), first.name       # the first layer's call
    assert "scaled by 1.001" in first.reason, first.reason
    assert first.location is not None and first.location.file.endswith("modeling_llama.py")
    # the other layer's silu kernel fails too; kernels without a silu do not
    assert all("silu" in op.name for op in result.failures), [o.name for o in result.failures]


@pytest.mark.slow
def test_bfloat16_kernels_pass_against_their_own_dtype_chain(tmp_path):
    """Inductor computes a bf16 kernel in float32 inside and rounds once; the reference chain
    rounds at each op: a healthy bf16 kernel is judged against what bf16 allows, and passes."""
    import opdiff
    from compilekit import llama

    model = llama(1).to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with fresh_compile(), opdiff.dump(model, str(tmp_path / "d"), level="L2", task="tensor"):
        torch.compile(model)(ids, labels=ids).loss.backward()
    torch._dynamo.reset()
    result = check_dump(tmp_path / "d" / "step0" / "rank0")
    kernels = _kernels(result)
    passed = [op for op in kernels if op.status == "pass"]
    assert not result.failures, [(op.name, op.reason) for op in result.failures[:3]]
    # every kernel is checked, the embedding's gradient too (an index_put accumulated in
    # float32, `aten._unsafe_masked_index_put_accumulate`, then converted to bf16)
    assert len(passed) == len(kernels) and len(kernels) >= 10, \
        [(op.name, op.reason) for op in kernels if op.status != "pass"]
    assert any("index_put" in step["op"] for rec in _records(tmp_path / "d")
               for step in rec.get("program", {}).get("steps", ())), "no index_put kernel"
    assert any(o.dtype == "bfloat16" for op in passed for o in op.outputs)
