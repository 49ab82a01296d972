"""The local-error rule: an op's own error is judged against a CPU kernel of its dtype on the
same inputs (dual benchmark), so a correct-but-different kernel passes and a wrong one does not."""
import math

import pytest
import torch

from opdiff.comparison.verdicts import Policy
from opdiff.comparison.replay.local import judge_tensor


def _bf16_operands(k=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(64, k, generator=g).bfloat16()
    b = torch.randn(k, 64, generator=g).bfloat16()
    return a, b


def _blocked_bf16_accumulate(a, b, block=64):
    """A poor bf16 GEMM: partial sums rounded to bf16 every `block` products."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
    for k in range(0, a.shape[1], block):
        acc = (acc.float() + a[:, k:k + block].float() @ b[k:k + block].float()).bfloat16()
    return acc


def test_different_but_correct_bf16_kernel_is_not_blamed():
    a, b = _bf16_operands()
    exact = a.double() @ b.double()
    reference = a @ b                                   # CPU's bf16 kernel
    other = (a.float() @ b.float()).bfloat16()          # fp32 accumulate, one rounding
    blocked = torch.zeros(64, 64)
    for k in range(0, 4096, 512):                       # another summation order
        blocked += a[:, k:k + 512].float() @ b[k:k + 512].float()
    for target in (other, blocked.bfloat16()):
        local = judge_tensor("mm.output.0", target, exact, reference, Policy())
        assert local.culprit == "", local


def test_bf16_kernel_with_bf16_accumulation_is_blamed():
    a, b = _bf16_operands()
    exact = a.double() @ b.double()
    local = judge_tensor("mm.output.0", _blocked_bf16_accumulate(a, b), exact, a @ b, Policy())
    assert local.culprit == "random"
    assert local.error > 3 * local.reference_error


@pytest.mark.parametrize("n", [1, 10, 2304])
def test_one_percent_scale_is_blamed_even_below_the_bf16_tolerance(n):
    g = torch.Generator().manual_seed(n)
    exact = torch.randn(n, generator=g, dtype=torch.float64)
    reference = exact.bfloat16()
    target = (exact * 1.01).bfloat16()
    local = judge_tensor("x.output.0", target, exact, reference, Policy())
    assert local.error < Policy().tolerance_for("bfloat16", "bfloat16")
    assert local.culprit == "scale", local
    healthy = judge_tensor("x.output.0", (exact * (1 + 1e-3 * torch.randn(n, generator=g,
                                          dtype=torch.float64))).bfloat16(), exact, reference,
                           Policy())
    assert healthy.culprit == "", healthy              # unbiased noise of a few ulp passes


def test_fp32_scale_of_1e4_is_blamed_and_reordering_is_not():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 512, generator=g)
    w = torch.randn(512, 128, generator=g)
    exact = x.double() @ w.double()
    reference = x @ w
    reordered = x[:, :256] @ w[:256] + x[:, 256:] @ w[256:]
    assert judge_tensor("mm", reordered, exact, reference, Policy()).culprit == ""
    assert judge_tensor("mm", reference * (1 + 1e-4), exact, reference, Policy()).culprit == "scale"


def test_inf_made_by_the_target_is_the_origin():
    exact = torch.tensor([1.0, 60000.0, 3.0], dtype=torch.float64)
    target = torch.tensor([1.0, math.inf, 3.0], dtype=torch.float16)
    local = judge_tensor("x", target, exact, exact.half(), Policy())
    assert local.culprit == "nonfinite"


def test_integer_output_is_blamed_only_when_the_reference_gets_it_right():
    exact = torch.tensor([2, 0, 1])
    assert judge_tensor("i", torch.tensor([2, 1, 1]), exact, exact.clone(), Policy()).culprit \
        == "integer"
    assert judge_tensor("i", torch.tensor([2, 1, 1]), exact, torch.tensor([2, 1, 1]),
                        Policy()).culprit == ""
