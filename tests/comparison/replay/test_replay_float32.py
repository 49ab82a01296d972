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
