"""A float32 output made from bfloat16 inputs is judged by bfloat16's tolerances: a correct
GPU kernel may keep its intermediate values in bf16 (cuDNN's batch norm backward under bf16
autocast: weight gradient 1.2e-3 from float64, scaled by 0.99917, found on an H200), while the
CPU reference kernel upcasts everything and sets a bar near 0."""
from __future__ import annotations

import torch

from opdiff.comparison.replay.local import compute_dtype
from opdiff.comparison.replay.rules import judge_tensor, settle
from opdiff.comparison.verdicts import Policy
from opdiff.store.schema import complete


def _weight_gradients():
    """A batch norm's weight gradient, sum over (dy * x_hat), from bf16 dy and x: exact, the
    CPU way (float32 throughout) and a GPU way (x_hat rounded to bf16 before the product)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, 8, 8, generator=g).to(torch.bfloat16)
    dy = torch.randn(64, 16, 8, 8, generator=g).to(torch.bfloat16)

    def grad(work, round_to=None):
        xw = x.to(work)
        x_hat = (xw - xw.mean((0, 2, 3), keepdim=True)) * torch.rsqrt(
            xw.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-5)
        if round_to is not None:
            x_hat = x_hat.to(round_to).to(work)
        return (dy.to(work) * x_hat).sum((0, 2, 3))

    exact = grad(torch.float64)
    return exact, grad(torch.float32).float(), grad(torch.float32, torch.bfloat16).float()


def test_a_float32_gradient_from_bf16_intermediates_is_cleared_by_bf16_tolerances():
    exact, cpu, gpu_like = _weight_gradients()
    policy = Policy()
    strict = judge_tensor("bn.backward.output.1", gpu_like, exact, cpu, policy)
    assert strict.culprit, "without the compute dtype the float32 bar should flag it"
    judged = judge_tensor("bn.backward.output.1", gpu_like, exact, cpu, policy, "bfloat16")
    assert judged.culprit == "", judged
    assert settle("bn.backward.output.1", gpu_like, exact, policy, compute="bfloat16") is not None


def test_a_one_percent_fault_in_such_a_gradient_is_still_named():
    exact, cpu, gpu_like = _weight_gradients()
    judged = judge_tensor("bn.backward.output.1", gpu_like * 1.01, exact, cpu, Policy(), "bfloat16")
    assert judged.culprit == "scale", judged


def test_compute_dtype_is_the_coarsest_floating_dtype_of_the_records():
    def desc(dtype):
        return {"type": "tensor", "dtype": dtype, "shape": [2]}
    fwd = complete({"name": "Functional.batch_norm.0.forward",
                    "inputs": [desc("bfloat16"), desc("float32"), {"type": "int", "value": 1}],
                    "outputs": [desc("float32")]})
    assert compute_dtype(fwd) == "bfloat16"
    assert compute_dtype(complete({"name": "a", "inputs": [desc("float32")], "outputs": [desc("float64")]})) == "float32"
    assert compute_dtype(complete({"name": "a", "inputs": [], "outputs": []})) is None
