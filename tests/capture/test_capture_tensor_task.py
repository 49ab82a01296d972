"""task="tensor": full tensors in safetensors shards, bitwise equal, each distinct value stored once."""
from __future__ import annotations


import pytest
import torch
import torch.nn as nn

import opdiff
from opdiff.store import iter_tensors


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _values():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, generator=g)
    x[0, 0] = float("nan")
    x[1, 1] = -0.0
    x[2, 2] = float("-inf")
    return {
        "float32": x,
        "bfloat16": x.bfloat16(),
        "float16": x.half(),
        "float64": x.double(),
        "int64": torch.arange(-5, 5),
        "bool": torch.tensor([True, False]),
        "zero_dim": torch.tensor(1.5),
        "transposed": x.t(),
        "sliced": x[1:3, ::2],
        "empty": torch.empty(0, 2),
    }


VALUES = _values()


@pytest.mark.parametrize("case", sorted(VALUES))
def test_saved_tensors_are_bitwise_equal_to_the_real_ones(case, dump_root, read_dump):
    t = VALUES[case]
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        out = t.clone()
        neg = torch.neg(t) if t.dtype != torch.bool else torch.logical_not(t)
    dump = read_dump(dump_root)
    rec = dump["Tensor.clone.0.forward"]
    if t.numel() == 0:
        key = rec["inputs"][0].get("key")
        assert key is None or dump.dump.tensor(key).shape == t.shape
        return
    assert bitwise_equal(dump.tensor(rec["inputs"][0]), t)
    assert bitwise_equal(dump.tensor(rec["outputs"][0]), out)
    neg_rec = dump.records[1]
    assert bitwise_equal(dump.tensor(neg_rec["outputs"][0]), neg)


def test_every_tensor_descriptor_of_a_model_run_resolves(model_cases, dump_root, read_dump):
    model, inputs, loss_fn = model_cases["transformer"].build()
    with opdiff.dump(model, dump_root, level="mix", task="tensor"):
        loss_fn(model(*inputs)).backward()
    dump = read_dump(dump_root)
    keys = set(dump.dump.tensor_keys())
    n = 0
    for record in dump.records:
        for name, _role, desc in iter_tensors(record):
            if desc["shape"] and 0 in desc["shape"]:
                continue
            assert desc.get("key") in keys, f"{name} has no saved tensor"
            t = dump.dump.tensor(desc["key"])
            assert list(t.shape) == desc["shape"] and str(t.dtype).endswith(desc["dtype"])
            n += 1
    assert n > 50
    # The parameters as the dump holds them are exactly the model's (nothing changed them).
    fc1 = dump["Module.fc1.Linear.forward.0"]
    assert bitwise_equal(dump.tensor(fc1["parameters"]["weight"]), model.fc1.weight.detach())
    grads = dump["Module.fc1.Linear.parameters_grad.0"]["parameters"]
    assert bitwise_equal(dump.tensor(grads["weight"]), model.fc1.weight.grad)


def test_a_parameter_read_by_many_ops_is_stored_once(dump_root, read_dump):
    lin = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    with opdiff.dump(lin, dump_root, level="mix", task="tensor"):
        for _ in range(4):
            x = lin(x)
        x.sum().backward()
    dump = read_dump(dump_root)
    weight_keys = set()
    for record in dump.records:
        if record["phase"] != "forward":
            continue
        for _name, _role, desc in iter_tensors(record):
            if desc["shape"] == [3, 3]:
                weight_keys.add(desc["key"])
    assert len(weight_keys) == 1
    (key,) = weight_keys
    assert bitwise_equal(dump.dump.tensor(key), lin.weight.detach())
    # Stored once on disk too: the shards hold each key once and no duplicate of the weight.
    from safetensors import safe_open
    stored = []
    for shard in sorted((dump.dir / "tensors").glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            stored += [f.get_tensor(k) for k in f.keys()]
    assert sum(bitwise_equal(t, lin.weight.detach()) for t in stored) == 1


def test_an_unchanged_tensor_is_stored_once_and_a_changed_one_again(dump_root, read_dump):
    x = torch.randn(5)
    before = x.clone()
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        x.exp()
        x.sin()
        x.add_(1)
        x.cos()
    dump = read_dump(dump_root)
    k_exp = dump["Tensor.exp.0.forward"]["inputs"][0]["key"]
    k_sin = dump["Tensor.sin.0.forward"]["inputs"][0]["key"]
    k_add = dump["Tensor.add_.0.forward"]["inputs"][0]["key"]
    k_cos = dump["Tensor.cos.0.forward"]["inputs"][0]["key"]
    assert k_exp == k_sin == k_add
    assert k_cos != k_exp
    assert bitwise_equal(dump.dump.tensor(k_exp), before)
    assert bitwise_equal(dump.dump.tensor(k_cos), before + 1)


def test_a_tensor_changed_through_data_is_stored_again(dump_root, read_dump):
    # `.data` writes bypass the version counter (old optimizers, EMA, weight clipping).
    p = torch.randn(5)
    before = p.clone()
    with opdiff.dump(None, dump_root, level="L1", task="tensor"):
        p.exp()
        p.data.clamp_(min=0)
        p.exp()
    dump = read_dump(dump_root)
    assert bitwise_equal(dump.tensor(dump["Tensor.exp.0.forward"]["inputs"][0]), before)
    assert bitwise_equal(dump.tensor(dump["Tensor.exp.1.forward"]["inputs"][0]), before.clamp(min=0))


def test_tensors_survive_a_second_step_with_the_same_debugger(dump_root, read_dump):
    lin = nn.Linear(2, 2)
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), task="tensor", level="L0")
    weights = []
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    for _ in range(2):
        dbg.start(lin)
        weights.append(lin.weight.detach().clone())
        lin(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    for step in (0, 1):
        dump = read_dump(dump_root, step=step)
        rec = dump["Module.Linear.forward.0"]
        assert bitwise_equal(dump.tensor(rec["parameters"]["weight"]), weights[step])
    assert not torch.equal(weights[0], weights[1])
