"""The replay's shortcut (`opdiff.comparison.replay.rules.settle`): an output whose error against
float64 is within what rounding to its dtype alone makes passes without the reference kernel;
every verdict stays the one the full rules give, a fault just above the threshold included."""
import pytest
import torch

import opdiff
from opdiff.comparison.replay import Replayer
from opdiff.comparison.replay.errors import errors_against, rounding_floor
from opdiff.comparison.replay.local import judge_tensor, replay_record, settle
from opdiff.comparison.verdicts import Policy
from opdiff.store.reader import open_dump
from replay_models import run

STOL = Policy().scale_tolerance_for("bfloat16", "bfloat16")    # the bf16 scale threshold


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rounding_floor_is_below_every_tensor_of_the_dtype(dtype):
    g = torch.Generator().manual_seed(3)
    exact = torch.randn(20000, generator=g, dtype=torch.float64) * 10
    floor = rounding_floor(exact, dtype)
    assert floor is not None and floor > 0
    nearest = exact.to(dtype)
    assert errors_against(nearest, exact).error >= floor      # the closest tensor there is
    for scale in (1e-3, 1e-2, 0.5):     # rounded the other way here and there: never below
        other = (exact * (1 + scale * torch.randn(20000, generator=g, dtype=torch.float64))
                 ).to(dtype)
        assert errors_against(other, exact).error >= floor
    assert rounding_floor(torch.tensor([1.0, float("inf")], dtype=torch.float64), dtype) is None
    assert rounding_floor(torch.tensor([1e39], dtype=torch.float64), torch.float16) is None


@pytest.mark.parametrize("fault", [0.0, 0.002, 0.0035, 0.0045, 0.005, 0.006, 0.01, 0.02])
@pytest.mark.parametrize("n", [64, 4096])
def test_settle_never_passes_what_the_full_rules_blame(fault, n):
    """A bf16 matmul scaled by 1 + fault around the 4e-3 scale threshold: whenever `settle`
    gives a verdict it is the full rules' one, and from just above the threshold it gives none
    (the reference runs and the fault is named)."""
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, 256, generator=g).bfloat16()
    b = torch.randn(256, 32, generator=g).bfloat16()
    exact = a.double() @ b.double()
    reference = a @ b
    target = ((a.float() @ b.float()) * (1 + fault)).bfloat16()
    full = judge_tensor("mm.output.0", target, exact, reference, Policy())
    quick = settle("mm.output.0", target, exact, Policy())
    if quick is not None:
        assert full.culprit == "" and quick.culprit == ""
        assert (quick.error, quick.scale_error) == (full.error, full.scale_error)
        assert quick.reference_error <= full.reference_error
    if fault > STOL * 1.2:
        assert quick is None and full.culprit == "scale", (fault, full)
    if fault == 0.0:
        assert quick is not None and not quick.reference_run     # healthy: no reference run


def test_settle_leaves_inf_and_integer_differences_to_the_full_rules():
    exact = torch.tensor([1.0, 60000.0, 3.0], dtype=torch.float64)
    assert settle("x", torch.tensor([1.0, float("inf"), 3.0], dtype=torch.float16), exact,
                  Policy()) is None
    idx = torch.tensor([0, 2, 1])
    assert settle("i", idx, idx.clone(), Policy()) is not None
    assert settle("i", idx, torch.tensor([0, 1, 1]), Policy()) is None


@pytest.fixture(scope="module")
def cnn_golden(tmp_path_factory):
    root = tmp_path_factory.mktemp("gold")
    run("cnn", root / "cnn")
    return root / "cnn"


def _target(root):
    return open_dump(str(next(root.rglob("records.jsonl")).parent))


def test_fault_just_above_the_threshold_is_found_with_the_shortcut(cnn_golden, tmp_path):
    """bf16 conv2d backward scaled by 1.006 (threshold 4e-3 plus the reference's own scale
    error): named by the default compare, and replayed alone the same verdict with the
    shortcut on and off."""
    assert 1.006 - 1 > STOL
    run("cnn", tmp_path / "t", bf16=True,
        fault=dict(op="Functional.conv2d", call=2, phase="backward", scale=1.006))
    result = opdiff.compare(tmp_path / "t", cnn_golden)
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.conv2d.2.backward", result.verdict
    assert "replayed in float64" in fd.reason and "bfloat16 CPU kernel" in fd.reason
    dump = _target(tmp_path / "t")
    records = {r["name"]: r for r in dump.records()}
    rec = records["Functional.conv2d.2.backward"]
    verdicts = [replay_record(rec, dump.tensor, Policy(), forward_record=records[rec["forward"]],
                              shortcut=shortcut) for shortcut in (True, False)]
    assert all(v.culprit for v in verdicts), [v.describe() for v in verdicts]
    assert [t.culprit for t in verdicts[0].tensors] == [t.culprit for t in verdicts[1].tensors]


def test_healthy_bf16_is_settled_mostly_without_the_reference(cnn_golden, tmp_path):
    """The shortcut does its work: most ops of a healthy bf16 CNN need no reference run, and
    every op's verdict is the one replaying with the reference gives."""
    run("cnn", tmp_path / "t", bf16=True)
    dump = _target(tmp_path / "t")
    names = [r["name"] for r in dump.records()]
    quick, full = Replayer(dump), Replayer(dump, shortcut=False)
    replayable = [n for n in names if quick.can_replay(n)]
    a = {n: quick.judge(n) for n in replayable}
    b = {n: full.judge(n) for n in replayable}
    assert [n for n in a if a[n].culprit] == [] == [n for n in b if b[n].culprit]
    assert all(a[n].replayed for n in a if b[n].replayed)
    settled = [n for n, v in a.items() if v.replayed and not any(t.reference_run for t in v.tensors)]
    assert len(settled) > len(replayable) / 2, quick.summary()
    assert "needed the reference kernel" in quick.summary()
    assert "within what rounding to bfloat16 alone makes" in a[settled[0]].describe()


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-autocast", "fp32"])
def test_direct_conv_backward_reference_is_autograds_bitwise(tmp_path, bf16):
    """`replay.direct`'s conv2d gradients (no forward run) are the autograd run's, for every
    conv of the CNN, all gradients or only the weight's, and in the float64 run."""
    from opdiff.comparison.replay.direct import backward_reference
    from opdiff.comparison.replay.local import _run, read_once

    run("cnn", tmp_path / "t", bf16=bf16)
    dump = _target(tmp_path / "t")
    records = {r["name"]: r for r in dump.records()}
    backward = [r for r in records.values() if r["op"] == "Functional.conv2d"
                and r["phase"] == "backward"]
    assert len(backward) >= 3
    autocast = torch.bfloat16 if bf16 else None
    load = read_once(dump.tensor)
    for rec in backward:
        fwd = records[rec["forward"]]
        grads = {0: dump.tensor(rec["inputs"][0]["key"])}
        leaves = [i for i, d in enumerate(rec["outputs"]) if d.get("type") == "tensor"]
        for want in (leaves, leaves[1:2]):
            direct = backward_reference(fwd, load, want, grads, autocast)
            assert direct is not None, rec["name"]
            with torch.autocast("cpu", enabled=False):
                slow = _run(fwd, load, None, autocast, want, grads)
            assert [d.dtype for d in direct] == [s.dtype for s in slow]
            assert all(torch.equal(d, s) for d, s in zip(direct, slow)), rec["name"]
        exact = {0: grads[0].double()}
        direct = backward_reference(fwd, load, leaves, exact, None, cast=torch.float64)
        slow = _run(fwd, load, torch.float64, None, leaves, exact)
        assert direct is not None and [d.dtype for d in direct] == [torch.float64] * len(leaves)
        assert all(torch.equal(d, s) for d, s in zip(direct, slow)), rec["name"]


def test_ops_exact_in_their_dtype_run_there_bit_for_bit_the_float64_result(tmp_path):
    """relu and flatten (`direct.exact_in_dtype`), and an addition's backward, run in the
    target's dtype: the same values as the float64 run and the same verdicts as the full
    rules."""
    from opdiff.comparison.replay.direct import exact_in_dtype
    from opdiff.comparison.replay.local import _exact_leaves, _forward_exact, read_once

    run("cnn", tmp_path / "d", bf16=True)
    dump = open_dump(tmp_path / "d" / "step0" / "rank0")
    records = {r["name"]: r for r in dump.records()}
    load = read_once(dump.tensor)
    seen, kinds = 0, set()
    for rec in records.values():
        if rec["op"] not in ("Functional.relu", "Tensor.flatten", "Tensor.__iadd__"):
            continue
        if rec["phase"] == "forward" and rec["op"] == "Tensor.__iadd__":
            assert not exact_in_dtype(rec)        # a rounded sum: only its gradients are exact
            continue
        if rec["phase"] == "forward":
            assert exact_in_dtype(rec), rec["name"]
            native = _forward_exact(rec, load, native=True)[2]
            exact = _forward_exact(rec, load)[2]
        else:
            fwd = records[rec["forward"]]
            grads = {0: load(rec["inputs"][0]["key"])}
            if not exact_in_dtype(fwd, grads):
                continue
            leaves = [i for i, d in enumerate(rec["outputs"]) if d.get("type") == "tensor"]
            native = _exact_leaves(fwd, load, leaves, grads, native=True)
            exact = _exact_leaves(fwd, load, leaves, grads)
        assert [n.dtype for n in native] != [e.dtype for e in exact]       # (it did run natively)
        assert all(torch.equal(n.double(), e) for n, e in zip(native, exact)), rec["name"]
        quick, full = (replay_record(rec, dump.tensor, Policy(), shortcut=s,
                                     forward_record=records.get(rec.get("forward")))
                       for s in (True, False))
        assert (quick.culprit, quick.replayed) == (full.culprit, full.replayed) == (False, True)
        seen += 1
        kinds.add((rec["op"], rec["phase"]))
    assert seen >= 6 and ("Tensor.__iadd__", "backward") in kinds, kinds
    mixed = dict(next(r for r in records.values() if r["op"] == "Functional.relu"))
    assert not exact_in_dtype(mixed, {0: torch.zeros(1, dtype=torch.float64)})   # cast on the way
    assert not exact_in_dtype(dict(mixed, op="Functional.gelu"))


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_relu_fault_is_found_with_the_exact_dtype_run(cnn_golden, tmp_path, phase):
    """A bf16 relu scaled by 1.02: the run in bf16 does not hide it; the compare names it."""
    run("cnn", tmp_path / "t", bf16=True,
        fault=dict(op="Functional.relu", call=2, phase=phase, scale=1.02))
    result = opdiff.compare(tmp_path / "t", cnn_golden)
    fd = result.first_divergence
    assert fd is not None and fd.name == f"Functional.relu.2.{phase}", result.verdict
