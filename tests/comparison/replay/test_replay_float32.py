"""The float32 conv forward with a proven bound (`replay.direct.forward_float32`) that settles a
healthy low-precision conv without its float64 run: the bound holds on real data, the bounded
rules never pass what the float64 rules would not, and a fault just above the threshold is
still named (the float64 run decides it)."""
import pytest
import torch

import opdiff
from opdiff.comparison.replay.direct import forward_float32
from opdiff.comparison.replay.errors import bounds_against, errors_against, rounding_floor
from opdiff.comparison.replay.local import _run, read_once, replay_record, settle
from opdiff.comparison.verdicts import Policy
from opdiff.store.reader import open_dump
from replay_models import run

STOL = Policy().scale_tolerance_for("bfloat16", "bfloat16")


def _dump(root):
    return open_dump(str(next(root.rglob("records.jsonl")).parent))


@pytest.fixture(scope="module")
def bf16_cnn(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16cnn")
    run("cnn", root, bf16=True)
    return _dump(root)


def test_float32_conv_is_within_its_bound_of_float64_and_settles_as_float64_does(bf16_cnn):
    records = [r for r in bf16_cnn.records()
               if r["op"] == "Functional.conv2d" and r["phase"] == "forward"]
    assert len(records) >= 3
    load = read_once(bf16_cnn.tensor)
    for rec in records:
        got = forward_float32(rec, load)
        assert got is not None, rec["name"]
        (approx,), (slack,) = got
        exact = _run(rec, load, torch.float64, None)[0]
        distance = float((approx.double() - exact).norm())
        assert distance <= slack, (rec["name"], distance, slack)
        assert slack < 1e-2 * float(exact.norm())     # and far below bf16's rounding
        target = load(rec["outputs"][0]["key"])
        quick = settle(rec["name"] + ".output.0", target, approx, Policy(), slack)
        full = settle(rec["name"] + ".output.0", target, exact, Policy())
        assert quick is not None and full is not None, rec["name"]
        assert quick.error >= full.error and quick.reference_error <= full.reference_error


@pytest.mark.parametrize("scale", [1e-4, 1e-3, 3e-3, 1e-2])
def test_bounded_errors_hold_for_every_tensor_within_the_slack(scale):
    g = torch.Generator().manual_seed(int(scale * 1e4))
    exact = torch.randn(5000, generator=g, dtype=torch.float64)
    target = (exact * (1 + 3e-3 * torch.randn(5000, generator=g, dtype=torch.float64))
              ).bfloat16()
    slack = scale * float(exact.norm())
    for _ in range(5):
        push = torch.randn(5000, generator=g, dtype=torch.float64)
        approx = exact + push * (slack / float(push.norm()))    # exact is within slack of it
        bound = bounds_against(target, approx, slack)
        true = errors_against(target, exact)
        assert bound is not None
        assert true.error <= bound.error and abs(true.scale_error) <= bound.scale_error
        floor = rounding_floor(approx, torch.bfloat16, slack)
        assert floor is not None and floor <= rounding_floor(exact, torch.bfloat16)
    assert bounds_against(target, exact, 2 * float(exact.norm())) is None


def test_conv_forward_fault_just_above_the_threshold_is_found(tmp_path):
    """A bf16 conv2d forward scaled by 1.006 (the scale threshold is 4e-3): the float32 run
    cannot settle it, the float64 run and the reference name it, as without the shortcut."""
    assert 1.006 - 1 > STOL
    gold = tmp_path / "g"
    run("cnn", gold)
    run("cnn", tmp_path / "t", bf16=True,
        fault=dict(op="Functional.conv2d", call=2, phase="forward", scale=1.006))
    result = opdiff.compare(tmp_path / "t", gold)
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.conv2d.2.forward", result.verdict
    dump = _dump(tmp_path / "t")
    rec = next(r for r in dump.records() if r["name"] == "Functional.conv2d.2.forward")
    verdicts = [replay_record(rec, dump.tensor, Policy(), shortcut=s) for s in (True, False)]
    assert all(v.culprit for v in verdicts), [v.describe() for v in verdicts]


def test_float32_conv_weight_gradient_is_within_its_bound_of_float64(bf16_cnn):
    from opdiff.comparison.replay.direct import backward_float32
    from opdiff.comparison.replay.local import _exact_leaves

    records = {r["name"]: r for r in bf16_cnn.records()}
    backward = [r for r in records.values()
                if r["op"] == "Functional.conv2d" and r["phase"] == "backward"]
    load = read_once(bf16_cnn.tensor)
    for rec in backward[:4]:
        fwd = records[rec["forward"]]
        grads = {0: load(rec["inputs"][0]["key"])}
        leaves = [i for i, d in enumerate(rec["outputs"]) if d.get("type") == "tensor"]
        got = backward_float32(fwd, load, leaves, grads)
        assert got is not None and set(got) == set(leaves), rec["name"]   # input and weight
        for leaf, (approx, slack) in got.items():
            exact = _exact_leaves(fwd, load, [leaf], grads)[0]
            distance = float((approx.double() - exact).norm())
            assert distance <= slack < 0.05 * float(exact.norm()), (rec["name"], distance, slack)
            if approx.dtype == torch.float32:      # the input gradient: tight enough to settle
                assert slack < 1e-3 * float(exact.norm())
                target = load(rec["outputs"][leaf]["key"])
                quick = settle(rec["name"], target, approx, Policy(), slack)
                full = settle(rec["name"], target, exact, Policy())
                assert quick is not None and full is not None, rec["name"]


@pytest.mark.parametrize("fault", [0.0, 0.003, 0.005, 0.01, 0.05, 0.2])
@pytest.mark.parametrize("relative_slack", [1e-4, 1e-2, 5e-2])
def test_judge_bounded_never_passes_what_the_float64_rules_blame(fault, relative_slack):
    """A float32 'weight gradient' whose reference is a bf16 kernel: the target scaled by
    1 + fault or given random error; whenever the bounded rules pass, the float64 rules pass
    for every exact result within the slack."""
    from opdiff.comparison.replay.local import judge_tensor
    from opdiff.comparison.replay.rules import judge_bounded

    g = torch.Generator().manual_seed(int(fault * 1000) + int(relative_slack * 1e5))
    a = torch.randn(4096, 64, generator=g).bfloat16()
    b = torch.randn(4096, 32, generator=g).bfloat16()
    exact = a.double().T @ b.double()
    reference = (a.T @ b).float()
    noise = 1 + fault * torch.randn(exact.shape, generator=g, dtype=torch.float64)
    for target in ((reference.double() * (1 + fault)).float(), (reference.double() * noise).float()):
        slack = relative_slack * float(exact.norm())
        push = torch.randn(exact.shape, generator=g, dtype=torch.float64)
        approx = exact + push * (0.9 * slack / float(push.norm()))
        quick = judge_bounded("w.output.1", target, approx, slack, reference, Policy())
        full = judge_tensor("w.output.1", target, exact, reference, Policy())
        if quick is not None:
            assert quick.culprit == "" and full.culprit == "", (fault, relative_slack, full)
        if fault == 0.0 and relative_slack < 1e-3:     # (far below the reference's 2e-3)
            assert quick is not None          # a healthy one passes without float64
    # the reference kernel's own result (a CPU target) passes however loose the bound
    assert judge_bounded("w.output.1", reference.clone(), approx, slack, reference, Policy())


@pytest.mark.parametrize("seed", range(6))
def test_a_target_near_the_reference_passes_for_every_exact_result(seed):
    """`near_reference`: within the distance it allows, the float64 rules pass whatever the
    exact result is (near the reference, far from it, zero); just beyond, some exact result
    makes the rules blame the target, so the rule is not looser than it says."""
    from opdiff.comparison.replay.local import judge_tensor
    from opdiff.comparison.replay.rules import RATIO, near_reference

    g = torch.Generator().manual_seed(seed)
    tol = Policy().tolerance_for("float32", "float32")
    tau = tol / 10
    reference = torch.randn(2000, generator=g, dtype=torch.float64).float()
    r_norm = float(reference.double().norm())
    step = torch.randn(2000, generator=g, dtype=torch.float64)
    allowed = tau * r_norm / (1 + tau) * 0.999
    assert near_reference(allowed, r_norm, tau) and not near_reference(allowed * 1.01, r_norm, tau)
    assert RATIO * allowed <= (RATIO - 1) * r_norm
    target = (reference.double() + step * (allowed / float(step.norm()))).float()
    u = float((target.double() - reference.double()).norm())
    if not near_reference(u, r_norm, tau):       # (float32 rounding moved it a little)
        pytest.skip("rounding moved the target beyond the allowed distance")
    for e in (reference.double(), reference.double() * 1.3, torch.zeros(2000, dtype=torch.float64),
              torch.randn(2000, generator=g, dtype=torch.float64) * 10,
              reference.double() + 1e-4 * torch.randn(2000, generator=g, dtype=torch.float64)):
        full = judge_tensor("w", target, e, reference, Policy())
        assert full.culprit == "", (full, seed)
        assert full.error <= RATIO * full.reference_error + tau
    # three times the distance, against the reference itself as the exact result: blamed
    far = (reference.double() + step * (3 * tau * r_norm / float(step.norm()))).float()
    assert judge_tensor("w", far, reference.double(), reference, Policy()).culprit == "random"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_errors_and_floor_in_one_sweep_are_the_two_functions_numbers(dtype):
    from opdiff.comparison.replay.errors import errors_and_floor

    g = torch.Generator().manual_seed(5)
    for n in (7, (1 << 20) + 3, 3 << 20):
        exact = torch.randn(n, generator=g, dtype=torch.float64) * 3
        target = (exact * (1 + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64))).to(dtype)
        (m, floor) = errors_and_floor(target, exact, dtype)
        one = errors_against(target, exact)
        assert (m.error, m.scale_error, floor) == (one.error, one.scale_error,
                                                   rounding_floor(exact, dtype))
    inf = torch.tensor([1.0, float("inf")], dtype=torch.float64)
    assert errors_and_floor(inf.to(dtype), inf, dtype) is None      # the slow ways decide


def test_a_conv_backward_finds_its_autocast_on_one_sample_with_the_same_verdict(bf16_cnn):
    """The first conv backward (its forward settled without the reference, so the autocast
    dtype is not known) takes it from one sample: the verdict is the one a backward gets
    whose forward ran the reference over the whole batch."""
    from opdiff.comparison.replay.direct import sample_autocast

    records = {r["name"]: r for r in bf16_cnn.records()}
    rec = next(r for r in records.values()
               if r["op"] == "Functional.conv2d" and r["phase"] == "backward")
    fwd = records[rec["forward"]]
    load = read_once(bf16_cnn.tensor)
    assert sample_autocast(fwd, load, [torch.bfloat16], [None, torch.bfloat16]) == (
        torch.bfloat16,)
    assert sample_autocast(fwd, load, [torch.float16], [None]) is None
    fresh = replay_record(rec, bf16_cnn.tensor, Policy(), forward_record=fwd, known={})
    known: dict = {}
    replay_record(fwd, bf16_cnn.tensor, Policy(), known=known, shortcut=False)
    assert known                                     # the forward's reference found it
    warm = replay_record(rec, bf16_cnn.tensor, Policy(), forward_record=fwd, known=known)
    assert fresh.replayed and fresh.reference == warm.reference
    assert fresh.tensors == warm.tensors


def test_all_finite_by_a_sum_never_says_finite_for_inf_or_nan():
    from opdiff.comparison.replay.direct import _all_finite

    x = torch.randn(1000)
    assert _all_finite(x)
    for bad in (float("inf"), float("-inf"), float("nan")):
        y = x.clone()
        y[17] = bad
        assert not _all_finite(y)
    assert not _all_finite(torch.full((4,), 3e38))    # an overflowing sum: float64 decides
