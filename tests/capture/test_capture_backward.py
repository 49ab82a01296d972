"""Backward records: gradients w.r.t. an op's outputs (record inputs) and its inputs (record outputs).

Every expected gradient is computed here by autograd on an uncaptured copy of the same graph.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import opdiff


def _leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).requires_grad_()


def _tensors(descs):
    return [d for d in descs if d.get("type") == "tensor"]


def test_backward_of_a_single_node_op_holds_both_gradients(dump_root, read_dump):
    a, b, g = _leaf(3, 4, seed=1), _leaf(3, 4, seed=2), torch.randn(3, 4)
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        y = torch.mul(a, b)
        (y * g).sum().backward()
    dump = read_dump(dump_root)
    rec = dump["Torch.mul.0.backward"]
    assert rec["forward"] == "Torch.mul.0.forward"
    grad_y = dump.tensor(rec["inputs"][0])
    grad_a, grad_b = (dump.tensor(d) for d in rec["outputs"])
    assert torch.equal(grad_y, g)
    assert torch.equal(grad_a, g * b.detach())
    assert torch.equal(grad_b, g * a.detach())


def test_backward_of_a_composite_op_is_wrt_the_ops_own_inputs(dump_root, read_dump):
    # F.linear on a 3-D input builds two autograd nodes (addmm, then a view): the record must
    # still hold the gradients of x, weight and bias, not of the internal addmm result.
    x, w, b = _leaf(2, 3, 4, seed=3), _leaf(5, 4, seed=4), _leaf(5, seed=5)
    g = torch.randn(2, 3, 5)
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        y = F.linear(x, w, b)
        (y * g).sum().backward()
    want = torch.autograd.grad((F.linear(x, w, b) * g).sum(), (x, w, b))
    rec = read_dump(dump_root)["Functional.linear.0.backward"]
    outs = _tensors(rec["outputs"])
    assert [d["shape"] for d in outs] == [[2, 3, 4], [5, 4], [5]]
    dump = read_dump(dump_root)
    for d, ref in zip(outs, want):
        assert torch.allclose(dump.tensor(d), ref, rtol=1e-6, atol=1e-6)


def test_backward_of_a_multi_output_op_holds_every_output_gradient(dump_root, read_dump):
    # nn.LSTM runs VF.lstm, which returns (seq, h, c); all three feed the loss.
    lstm = nn.LSTM(4, 3, batch_first=True)
    x = _leaf(2, 5, 4, seed=6)
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        seq, (h, c) = lstm(x)
        (seq.sum() + 2 * h.sum() + 3 * c.sum()).backward()
    rec = read_dump(dump_root)["VF.lstm.0.backward"]
    grads_in = _tensors(rec["inputs"])
    assert [d["shape"] for d in grads_in] == [[2, 5, 3], [1, 2, 3], [1, 2, 3]]
    dump = read_dump(dump_root)
    assert torch.equal(dump.tensor(grads_in[1]), torch.full((1, 2, 3), 2.0))
    assert torch.equal(dump.tensor(grads_in[2]), torch.full((1, 2, 3), 3.0))
    # The first gradient w.r.t. the op's inputs is the one for x.
    assert _tensors(rec["outputs"])[0]["shape"] == [2, 5, 4]


def test_split_backward_sees_the_gradient_of_every_output(dump_root, read_dump):
    x = _leaf(4, 3, seed=7)
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        p, q = x.split(2)
        (p.sum() * 2 + q.sum() * 5).backward()
    dump = read_dump(dump_root)
    rec = dump["Tensor.split.0.backward"]
    grads = _tensors(rec["inputs"])
    assert [dump.tensor(d).unique().tolist() for d in grads] == [[2.0], [5.0]]
    assert torch.equal(dump.tensor(_tensors(rec["outputs"])[0]), x.grad)


def test_module_backward_with_inplace_relu_after_the_module(model_cases, dump_root, read_dump):
    model, (x,), loss_fn = model_cases["inplace_relu"].build()
    with opdiff.dump(model, dump_root, level="mix", task="tensor"):
        loss_fn(model(x)).backward()
    # Reference: the same computation written out of place, with the pre-ReLU grads retained.
    z1 = F.linear(x, model.fc1.weight, model.fc1.bias)
    z1.retain_grad()
    a1 = F.relu(z1)
    a1.retain_grad()
    z2 = F.linear(a1, model.fc2.weight, model.fc2.bias)
    z2.retain_grad()
    loss_fn(F.linear(F.relu(z2), model.fc3.weight, model.fc3.bias)).backward()
    dump = read_dump(dump_root)
    fc1 = dump["Module.fc1.Linear.backward.0"]
    fc2 = dump["Module.fc2.Linear.backward.0"]
    # Gradient w.r.t. the module's output is the one for the value before ReLU overwrote it.
    assert torch.allclose(dump.tensor(fc1["inputs"][0]), z1.grad, atol=1e-7)
    assert torch.allclose(dump.tensor(fc2["inputs"][0]), z2.grad, atol=1e-7)
    act = dump["Module.act.ReLU.backward.0"]
    assert act["forward"] == "Module.act.ReLU.forward.0"
    # The in-place module's own gradients: w.r.t. what it wrote, and w.r.t. what it was given.
    assert torch.allclose(dump.tensor(act["inputs"][0]), a1.grad, atol=1e-7)
    assert torch.allclose(dump.tensor(act["outputs"][0]), z1.grad, atol=1e-7)
    assert not torch.allclose(a1.grad, z1.grad)
    relu = dump["Functional.relu.1.forward"]   # F.relu(..., inplace=True)
    assert relu["kwargs"]["inplace"] == {"type": "bool", "value": True}
    # Forward input of the in-place ReLU is the value before it ran (it has negatives).
    assert dump.tensor(relu["inputs"][0]).min() < 0
    assert dump.tensor(relu["outputs"][0]).min() >= 0


class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(4, 6)
        self.seg = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        h = self.inp(x)
        h = checkpoint(self.seg, h, use_reentrant=self.reentrant)
        return self.out(h)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_activation_checkpointing_is_captured_sensibly(reentrant, dump_root, read_dump):
    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    x = torch.randn(3, 4)
    with opdiff.dump(model, dump_root, level="mix", task="statistics"):
        model(x).pow(2).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).pow(2).sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(got, model.parameters()))
    dump = read_dump(dump_root)
    assert not any("error" in r for r in dump.records), [r["error"] for r in dump.records if "error" in r]
    # The recomputation inside backward must not be recorded as a second forward.
    fwd_linear = dump.with_op("Functional.linear")
    assert len(fwd_linear) == 4
    assert len(dump.with_op("Module.seg.0.Linear")) == 1
    assert len(dump.with_op("Module.out.Linear", "backward")) == 1
    assert len(dump.with_op("Module.inp.Linear", "backward")) == 1
    grads = {r["op"] for r in dump.records if r["kind"] == "param_grad"}
    assert grads == {"Module.inp.Linear.parameters_grad", "Module.seg.0.Linear.parameters_grad",
                     "Module.seg.2.Linear.parameters_grad", "Module.out.Linear.parameters_grad"}
    if not reentrant:
        # The original graph is kept: ops inside the segment get their backward records.
        assert len(dump.with_op("Functional.linear", "backward")) == 4


def test_backward_outputs_are_this_ops_contribution_to_a_shared_input(dump_root, read_dump):
    # x feeds exp and sin: exp's record holds exp's share of x's gradient, not x.grad.
    x = _leaf(5, seed=8)
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        (x.exp().sum() + (3 * x.sin()).sum()).backward()
    dump = read_dump(dump_root)
    exp_share = dump.tensor(_tensors(dump["Tensor.exp.0.backward"]["outputs"])[0])
    sin_share = dump.tensor(_tensors(dump["Tensor.sin.0.backward"]["outputs"])[0])
    assert torch.allclose(exp_share, x.detach().exp())
    assert torch.allclose(sin_share, 3 * x.detach().cos())
    assert torch.allclose(exp_share + sin_share, x.grad)


def test_backward_of_an_inplace_op(dump_root, read_dump):
    a, b = _leaf(4, seed=9), _leaf(4, seed=10)
    g = torch.randn(4)
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        y = a * 2
        y.mul_(b)                      # y = 2a * b, in place
        (y * g).sum().backward()
    dump = read_dump(dump_root)
    rec = dump["Tensor.mul_.0.backward"]
    assert torch.equal(dump.tensor(rec["inputs"][0]), g)
    grad_y_before, grad_b = (dump.tensor(d) for d in _tensors(rec["outputs"]))
    assert torch.allclose(grad_y_before, g * b.detach())
    assert torch.allclose(grad_b, g * 2 * a.detach())
    # The forward record shows y before the multiplication.
    assert torch.equal(dump.tensor(dump["Tensor.mul_.0.forward"]["inputs"][0]), 2 * a.detach())


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_l2_does_not_record_checkpoint_recomputation_as_backward_ops(reentrant, tmp_path, read_dump):
    # A run with activation checkpointing must line up with one without: the forward re-run
    # inside backward is not a set of backward ops.
    def run(root, use_checkpoint):
        torch.manual_seed(0)
        model = _Checkpointed(reentrant)
        x = torch.randn(3, 4)
        if not use_checkpoint:
            model.forward = lambda x_: model.out(model.seg(model.inp(x_)))
        with opdiff.dump(model, root, level="L2"):
            model(x).pow(2).sum().backward()
        dump = read_dump(root)
        return dump.ops(phase="forward"), sorted(dump.ops(phase="backward"))

    plain_fwd, plain_bwd = run(tmp_path / "plain", False)
    ckpt_fwd, ckpt_bwd = run(tmp_path / "ckpt", True)
    assert ckpt_fwd == plain_fwd
    assert ckpt_bwd == plain_bwd


class _TwoOut(nn.Module):
    """Two output tensors and two inputs: module gradient groups that need the engine's nodes."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, y):
        return self.a(x).relu(), self.b(y) * 2


def _activation_refs(model, x, y, backward: bool):
    import weakref
    refs = []
    handle = model.register_forward_hook(lambda m, a, out: refs.extend(weakref.ref(t) for t in out))
    try:
        p, q = model(x, y)
        if backward:
            (p.sum() + q.sum()).backward()
    finally:
        handle.remove()
    return refs


@pytest.mark.parametrize("level", ["L0", "mix", "L1"])
@pytest.mark.parametrize("backward", [True, False])
def test_captured_graphs_and_activations_are_freed_after_the_step(dump_root, level, backward):
    """Backward hooks must not keep their own graph alive (a C++ reference cycle leaked every
    hooked graph, 250 MB a step on the benchmark CNN)."""
    import gc
    model = _TwoOut()
    x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    refs = []
    for step in range(2):
        dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root / f"s{step}"), level=level)
        dbg.start(model)
        refs += _activation_refs(model, x, y, backward)
        dbg.stop()
        dbg.step()
    gc.collect()
    assert refs and all(r() is None for r in refs)


def test_hooks_on_leaf_module_inputs_do_not_pile_up_across_steps(dump_root, read_dump):
    """A module fed a leaf that requires grad (a learned query, a parameter passed in): the hook
    on it lives on the tensor, so it must go when its step closes."""
    model = _TwoOut()
    x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L0")
    for _step in range(3):
        dbg.start(model)
        p, q = model(x, y)
        (p.sum() + q.sum()).backward()
        dbg.stop()
        dbg.step()
        assert not x._backward_hooks and not y._backward_hooks
    dump = read_dump(dump_root, step=2)
    backward = sorted(r["name"] for r in dump.records if r["phase"] == "backward" and r["kind"] == "module")
    assert backward == ["Module.a.Linear.backward.0", "Module.b.Linear.backward.0"]
    assert not any("error" in r for r in dump.records)
    for name in backward:
        assert dump[name]["outputs"][0]["type"] == "tensor"
