"""Levels L0 / L1 / mix / L2: what each one records, and how records are named and linked."""
from __future__ import annotations

import re

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import relu  # imported by value: msprobe's monkeypatching misses this one
from torch.nn.functional import gelu as imported_gelu

import opdiff

_API_NAME = re.compile(r"^(Torch|Functional|Tensor|VF|Distributed)\.[\w.]+\.\d+\.(forward|backward)$")
_MODULE_NAME = re.compile(r"^Module\.[\w.]+\.(forward|backward)\.\d+$")


def test_l1_records_torch_functional_tensor_methods_and_operators(dump_root, read_dump):
    x = torch.randn(3, 4)
    y = torch.randn(3, 4)
    w = torch.randn(4, 2)
    with opdiff.dump(None, dump_root, level="L1"):
        a = torch.tanh(x)              # Torch.tanh
        b = F.softplus(y)              # Functional.softplus
        c = a.mul(b)                   # Tensor.mul
        d = a + b                      # Tensor.__add__
        d += c                         # Tensor.__iadd__
        d.add_(1.0)                    # Tensor.add_ (the method, not the operator)
        e = d @ w                      # Tensor.__matmul__
        f = e[0]                       # Tensor.__getitem__
        g = relu(f)                    # Torch.relu, imported by value
        h = imported_gelu(g)           # Functional.gelu, imported by value
        d[0] = 0.0                     # Tensor.__setitem__
        _ = -h                         # Tensor.__neg__
        _ = d * 2                      # Tensor.__mul__
    dump = read_dump(dump_root)
    ops = dump.ops(phase="forward")
    assert ops == ["Torch.tanh", "Functional.softplus", "Tensor.mul", "Tensor.__add__",
                   "Tensor.__iadd__", "Tensor.add_", "Tensor.__matmul__", "Tensor.__getitem__",
                   "Torch.relu", "Functional.gelu", "Tensor.__setitem__", "Tensor.__neg__",
                   "Tensor.__mul__"]
    for name in dump.names():
        assert _API_NAME.match(name), name
    assert all(r["kind"] == "api" for r in dump.records)


def test_l1_skips_attribute_reads_and_metadata(dump_root, read_dump):
    p = torch.randn(3, requires_grad=True)
    (p * 2).sum().backward()
    with opdiff.dump(None, dump_root, level="L1"):
        _ = p.grad, p.shape, p.data, p.requires_grad, p.dtype, p.device, p.is_leaf, p.grad_fn
        _ = p.size(), p.dim(), p.numel(), p.is_contiguous()
        p.detach().exp()
    dump = read_dump(dump_root)
    assert dump.ops() == ["Tensor.detach", "Tensor.exp"]


def test_l1_records_only_the_outermost_call(dump_root, read_dump):
    x = torch.randn(2, 3, 8)
    norm = nn.LayerNorm(8)
    attn = nn.MultiheadAttention(8, 2, batch_first=True)
    with opdiff.dump(None, dump_root, level="L1"):
        y = F.layer_norm(x, (8,), norm.weight, norm.bias)     # calls torch.layer_norm inside
        attn(y, y, y, need_weights=False)                     # dozens of nested torch calls
    dump = read_dump(dump_root)
    ops = dump.ops(phase="forward")
    assert ops[0] == "Functional.layer_norm"
    assert "Torch.layer_norm" not in ops
    assert "Functional.multi_head_attention_forward" in ops
    # Nothing called from inside multi_head_attention_forward may appear on its own.
    assert "Functional.linear" not in ops and "Functional.scaled_dot_product_attention" not in ops


def test_l0_records_every_module_call_with_parameters_and_gradients(model_cases, dump_root, read_dump,
                                                                   check_stats):
    model, inputs, loss_fn = model_cases["cnn"].build()
    with opdiff.dump(model, dump_root, level="L0"):
        loss = loss_fn(model(*inputs))
        loss.backward()
    dump = read_dump(dump_root)
    # (and each parameter and input once, before its first read: capture/leaves.py)
    assert {r["kind"] for r in dump.records} == {"module", "param_grad", "leaf"}
    expected = {f"Module.{path}.{type(m).__name__}" for path, m in model.named_modules() if path}
    assert {r["op"] for r in dump.records if r["phase"] == "forward" and r["kind"] != "leaf"} \
        == expected
    leaves = {r["tensor"] for r in dump.records if r["kind"] == "leaf"}
    assert {n for n, _ in model.named_parameters()} <= leaves
    # relu is one module object called twice at top level; its counter says so.
    assert "Module.relu.ReLU.forward.0" in dump.by_name
    assert "Module.layer1.0.relu.ReLU.forward.1" in dump.by_name
    for r in dump.records:
        if r["kind"] == "module":
            assert _MODULE_NAME.match(r["name"]), r["name"]
    # Parameters at forward time, and one backward record per module whose output needs grad.
    conv = dump["Module.layer1.0.conv1.Conv2d.forward.0"]
    check_stats(conv["parameters"]["weight"], model.layer1[0].conv1.weight, what="conv1.weight")
    assert dump["Module.layer1.0.conv1.Conv2d.backward.0"]["forward"] == conv["name"]
    backward_ops = {r["op"] for r in dump.records if r["phase"] == "backward" and r["kind"] == "module"}
    assert backward_ops == expected
    # Parameter gradients: every parameter of every module, equal to what autograd left in .grad.
    grads = {r["op"]: r for r in dump.records if r["kind"] == "param_grad"}
    for path, mod in model.named_modules():
        own = dict(mod.named_parameters(recurse=False))
        if not own:
            continue
        rec = grads[f"Module.{path}.{type(mod).__name__}.parameters_grad"]
        assert set(rec["parameters"]) == set(own)
        for pname, p in own.items():
            check_stats(rec["parameters"][pname], p.grad, what=f"{path}.{pname}.grad")


def test_mix_links_each_api_call_to_the_module_it_ran_in(model_cases, dump_root, read_dump):
    model, inputs, loss_fn = model_cases["cnn"].build()
    with opdiff.dump(model, dump_root, level="mix"):
        loss_fn(model(*inputs)).backward()
    dump = read_dump(dump_root)
    kinds = {r["kind"] for r in dump.records}
    assert {"api", "module", "param_grad"} <= kinds
    convs = dump.with_op("Functional.conv2d")
    assert [c["module"] for c in convs] == ["Module.conv1.Conv2d.forward.0",
                                            "Module.layer1.0.conv1.Conv2d.forward.0",
                                            "Module.layer1.0.conv2.Conv2d.forward.0"]
    iadd = dump["Tensor.__iadd__.0.forward"]
    assert iadd["module"] == "Module.layer1.0.BasicBlock.forward.0"
    # Module records nest: a module's `module` is its parent call.
    assert dump["Module.layer1.0.conv1.Conv2d.forward.0"]["module"] == "Module.layer1.0.BasicBlock.forward.0"
    assert dump["Module.layer1.0.BasicBlock.forward.0"]["module"] == "Module.layer1.Sequential.forward.0"
    # Every module named by an API record is a module call recorded in this dump.
    for r in dump.records:
        if r["kind"] == "api" and r["module"] is not None:
            assert r["module"] in dump.by_name, r["name"]
    # Outside any module (the loss), `module` is null.
    assert dump.with_op("Tensor.pow")[0]["module"] is None


def test_l2_records_aten_ops_forward_and_backward_with_links(model_cases, dump_root, read_dump):
    model, inputs, loss_fn = model_cases["cnn"].build()
    with opdiff.dump(model, dump_root, level="L2"):
        loss_fn(model(*inputs)).backward()
    dump = read_dump(dump_root)
    assert {r["kind"] for r in dump.records} == {"aten", "leaf"}
    fwd = dump.with_op("Aten.convolution", "forward")
    assert len(fwd) == 3
    bwd = [r for r in dump.records if r["phase"] == "backward" and r["op"] == "Aten.convolution_backward"]
    assert len(bwd) == 3
    # Each convolution backward links to a convolution forward, all three distinct.
    assert sorted(r["forward"] for r in bwd) == sorted(r["name"] for r in fwd)
    # The in-place residual add appears as aten add_ in forward.
    assert dump.with_op("Aten.add_", "forward")
    # Backward ops run after every forward op.
    phases = [r["phase"] for r in dump.records]
    assert phases.index("backward") > max(i for i, p in enumerate(phases) if p == "forward") - 1
    for r in dump.records:
        if r["kind"] != "leaf":
            assert re.match(r"^Aten\.\w+\.\d+\.(forward|backward)$", r["name"]), r["name"]


def test_counters_count_per_name_and_restart_every_step(dump_root, read_dump):
    x = torch.randn(4)
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1", task="statistics")
    for _ in range(2):
        dbg.start()
        a = x.exp()
        b = x.exp() + a
        torch.tanh(b).exp()
        dbg.stop()
        dbg.step()
    for step in (0, 1):
        dump = read_dump(dump_root, step=step)
        assert dump.names() == ["Tensor.exp.0.forward", "Tensor.exp.1.forward", "Tensor.__add__.0.forward",
                                "Torch.tanh.0.forward", "Tensor.exp.2.forward"]
        assert dump.meta["step"] == step


def test_module_names_follow_msprobe_for_nested_models(dump_root, read_dump):
    model = nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.Tanh()), nn.Linear(3, 1))
    with opdiff.dump(model, dump_root, level="L0"):
        model(torch.randn(2, 3)).sum().backward()
    dump = read_dump(dump_root)
    fwd = dump.names(kind="module", phase="forward")
    assert fwd == ["Module.0.0.Linear.forward.0", "Module.0.1.Tanh.forward.0", "Module.0.Sequential.forward.0",
                   "Module.1.Linear.forward.0"]


class _MaskedInner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, mask=None):
        return self.lin(x) * mask


class _CallsByKeyword(nn.Module):
    """Hugging Face style: submodules called with keyword arguments only."""

    def __init__(self):
        super().__init__()
        self.inner = _MaskedInner()

    def forward(self, x, mask):
        return self.inner(x=x, mask=mask)


def test_module_inputs_passed_by_keyword_are_recorded(dump_root, read_dump, check_stats):
    model = _CallsByKeyword()
    x = torch.randn(2, 3, requires_grad=True)
    mask = (torch.rand(2, 3) > 0.3).float()
    with opdiff.dump(model, dump_root, level="L0", task="tensor"):
        model(x, mask).sum().backward()
    dump = read_dump(dump_root)
    rec = dump["Module.inner._MaskedInner.forward.0"]
    kwargs = rec.get("kwargs") or {}
    assert set(kwargs) == {"x", "mask"}, "keyword inputs of the module call are missing"
    check_stats(kwargs["x"], x, what="x by keyword")
    check_stats(kwargs["mask"], mask, what="mask by keyword")
    # Its backward holds the gradient w.r.t. x, passed by keyword.
    back = dump["Module.inner._MaskedInner.backward.0"]
    grads = [d for d in back["outputs"] if d.get("type") == "tensor"]
    assert len(grads) == 1 and torch.equal(dump.tensor(grads[0]), x.grad)


def test_every_level_the_config_accepts_has_its_layers():
    from opdiff import config
    from opdiff.capture.debugger import LEVELS

    assert set(LEVELS) == set(config.LEVELS)
    assert all(LEVELS[level] for level in config.LEVELS)
