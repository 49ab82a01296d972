"""Call rebuilding: every kind of recorded call comes back as the same function with the same
arguments, so re-running it on the saved inputs reproduces the saved outputs bit for bit."""
import pytest
import torch
import torch.nn.functional as F

import opdiff
from opdiff.comparison.replay.calls import NotReplayable, rebuild_call, resolve
from opdiff.comparison.replay.local import replay_record
from opdiff.store.reader import find_dumps, open_dump
from opdiff.store.schema import complete


def workload(x, y, w, b, idx):
    a = F.linear(x, w, bias=b)                         # Functional with a kwarg
    c = torch.cat([a, y], dim=1)                       # Torch, nested list of tensors
    d = c.transpose(0, 1).contiguous()                 # Tensor methods
    e = d + 1.5                                        # operator with a Python scalar
    e += d                                             # in-place operator (Tensor.__iadd__)
    f = torch.softmax(e, dim=-1)                       # Torch with a kwarg
    g = f[:, 1:3]                                      # __getitem__ with a slice
    h = g.to(torch.float64)                            # dtype argument
    i = torch.index_select(c, 0, idx)                  # integer tensor argument
    j = torch.stack((i.sum(0), i.amax(0)), dim=0)      # tuple of tensors, int kwarg
    k = F.dropout(j, p=0.0, training=True)             # a "random" op that draws nothing
    m = F.dropout(j, p=0.5, training=True)             # a random op
    return h.sum() + k.sum() + m.sum()


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    path = tmp_path_factory.mktemp("calls")
    torch.manual_seed(0)
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    w, b = torch.randn(5, 6), torch.randn(5)
    idx = torch.tensor([0, 2, 3])
    with opdiff.dump(None, path, level="L1", task="tensor"):
        workload(x, y, w, b, idx)
    dump = open_dump(find_dumps(path)[0])
    return dump, {r["name"]: r for r in dump.records()}


def _outputs(dump, record):
    return [dump.tensor(d["key"]) for d in record["outputs"] if d.get("type") == "tensor"]


@pytest.mark.parametrize("name", [
    "Functional.linear.0.forward", "Torch.cat.0.forward", "Tensor.transpose.0.forward",
    "Tensor.__add__.0.forward", "Tensor.__iadd__.0.forward", "Torch.softmax.0.forward",
    "Tensor.__getitem__.0.forward", "Tensor.to.0.forward", "Torch.index_select.0.forward",
    "Torch.stack.0.forward", "Functional.dropout.0.forward"])
def test_rebuilt_call_reproduces_the_recorded_output_bitwise(dumped, name):
    dump, records = dumped
    assert name in records, sorted(records)
    out = rebuild_call(records[name], dump.tensor).run()
    got = out if isinstance(out, (tuple, list)) else [out]
    want = _outputs(dump, records[name])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), name


def test_kwargs_nested_lists_and_literals_come_back_as_python_values(dumped):
    dump, records = dumped
    call = rebuild_call(records["Torch.cat.0.forward"], dump.tensor)
    assert call.func is torch.cat and isinstance(call.args[0], list) and len(call.args[0]) == 2
    assert call.kwargs == {"dim": 1}
    call = rebuild_call(records["Functional.linear.0.forward"], dump.tensor)
    assert call.func is F.linear and set(call.kwargs) == {"bias"}
    assert [k for k, _ in call.tensors][-1] == records["Functional.linear.0.forward"]["kwargs"]["bias"]["key"]
    call = rebuild_call(records["Tensor.__getitem__.0.forward"], dump.tensor)
    assert call.args[1] == (slice(None, None, None), slice(1, 3, None))
    call = rebuild_call(records["Tensor.to.0.forward"], dump.tensor)
    assert call.args[1] is torch.float64


def test_float64_rebuild_casts_floats_and_keeps_integers(dumped):
    dump, records = dumped
    call = rebuild_call(records["Torch.index_select.0.forward"], dump.tensor, cast=torch.float64)
    assert call.args[0].dtype == torch.float64 and call.args[2].dtype == torch.int64
    out = call.run()
    want = _outputs(dump, records["Torch.index_select.0.forward"])[0]
    assert torch.equal(out, want.double())


def test_in_place_replay_leaves_the_dump_untouched(dumped):
    dump, records = dumped
    rec = records["Tensor.__iadd__.0.forward"]
    before = dump.tensor(rec["inputs"][0]["key"]).clone()
    rebuild_call(rec, dump.tensor).run()
    rebuild_call(rec, dump.tensor, cast=torch.float64).run()
    assert torch.equal(dump.tensor(rec["inputs"][0]["key"]), before)


def test_random_op_is_not_replayed_and_says_why(dumped):
    dump, records = dumped
    state = torch.get_rng_state()
    local = replay_record(records["Functional.dropout.1.forward"], dump.tensor, _policy())
    assert not local.replayed and "random" in local.reason
    assert torch.equal(torch.get_rng_state(), state)        # the draw was undone
    kept = replay_record(records["Functional.dropout.0.forward"], dump.tensor, _policy())
    assert kept.replayed and not kept.culprit                # p=0 draws nothing


def test_missing_tensor_is_not_replayed(dumped):
    dump, records = dumped
    local = replay_record(records["Torch.cat.0.forward"], lambda key: None, _policy())
    assert not local.replayed and "not saved" in local.reason


def _policy():
    from opdiff.comparison.verdicts import Policy
    return Policy()


@pytest.mark.parametrize("name,func", [
    ("Functional.relu", F.relu), ("Torch.cat", torch.cat), ("Tensor.add_", torch.Tensor.add_),
    ("Tensor.__iadd__", torch.Tensor.__iadd__), ("Tensor.__getitem__", torch.Tensor.__getitem__),
    ("VF.lstm", torch._VF.lstm), ("Torch.linalg.norm", torch.linalg.norm),
    ("Aten.mm", torch.ops.aten.mm)])
def test_resolve_names(name, func):
    assert resolve(name) is func


@pytest.mark.parametrize("name,why", [
    ("Functional.no_such_op", "not an op replay trusts"), ("Distributed.all_reduce", "collective"),
    ("Torch.empty", "uninitialised"), ("Module.fc.Linear", "not an op replay trusts"),
    ("Tensor.chain_matmul", "no torch function")])
def test_unresolvable_names_say_why(name, why):
    with pytest.raises(NotReplayable, match=why):
        resolve(name)


def test_object_arguments_other_than_slices_are_refused():
    rec = complete({"name": "Tensor.__getitem__.0.forward", "op": "Tensor.__getitem__",
                    "inputs": [{"type": "tensor", "dtype": "float32", "shape": [2], "key": "x"},
                               {"type": "object", "value": "<SomeIndexer object at 0x7f>"}]})
    with pytest.raises(NotReplayable, match="recorded only as"):
        rebuild_call(rec, {"x": torch.ones(2)}.get)


def test_a_custom_op_replays_through_its_registered_cpu_reference():
    from opdiff import ops
    from opdiff.comparison.replay.local import replay_record

    name = "Torch.opdiff_test_fused_gelu"
    with pytest.raises(NotReplayable, match="not an op replay trusts"):
        resolve(name)
    ops.register(name, cpu_reference=lambda x: F.gelu(x))
    try:
        x = torch.randn(256, generator=torch.Generator().manual_seed(0))
        tensors = {"x": x, "good": F.gelu(x), "bad": F.gelu(x) * 1.01}
        for key, culprit in (("good", False), ("bad", True)):
            rec = complete({"name": f"{name}.0.forward", "op": name, "kind": "api", "phase": "forward",
                            "inputs": [{"type": "tensor", "dtype": "float32", "shape": [256], "key": "x"}],
                            "outputs": [{"type": "tensor", "dtype": "float32", "shape": [256], "key": key}]})
            local = replay_record(rec, tensors.get, _policy())
            assert local.replayed and local.culprit is culprit, local.reason
    finally:
        ops.register(name, cpu_reference=None)


def test_the_size_check_broadcasts_as_torch_does_without_importing_sympy():
    import subprocess
    import sys

    from opdiff.comparison.replay.calls import broadcast

    cases = [[(2, 4, 8, 8), (2, 4, 8, 8)], [(2, 4, 8, 8), (1, 8)], [(2, 4, 8, 8), (2, 2, 8, 8)],
             [(3,), ()], [(0, 4), (1, 4)], [(5, 1), (1, 6), (6,)]]
    for shapes in cases:
        try:
            expected = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError:
            expected = ()
        assert broadcast(shapes) == expected, shapes
    # torch.broadcast_shapes imports sympy (seconds) on its first call; the first replay of a
    # compare must not pay that
    code = ("import sys, torch; from opdiff.comparison.replay.calls import rebuild_call; "
            "from opdiff.store.schema import complete; "
            "x = {'type': 'tensor', 'dtype': 'float32', 'shape': [2, 3], 'key': 'k'}; "
            "rebuild_call(complete({'name': 'Torch.add.0.forward', 'op': 'Torch.add', 'inputs': [x, x]}), "
            "lambda k: torch.ones(2, 3)).run(); print('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_an_out_tensor_written_unread_is_dropped_and_a_read_one_refused(tmp_path):
    """Inductor calls `mm(a, b, out=buf)` on a fresh buffer: captured at L2 the out= tensor is
    described as overwritten, and replay runs `mm(a, b)`; an out= tensor with values is refused."""
    torch.manual_seed(0)
    a, b, buf = torch.randn(4, 6), torch.randn(6, 5), torch.empty(4, 5)
    with opdiff.dump(None, tmp_path, level="L2", task="tensor"):
        torch.mm(a, b, out=buf)
    dump = open_dump(find_dumps(tmp_path)[0])
    rec = next(r for r in dump.records() if r["op"] == "Aten.mm")
    assert rec["kwargs"]["out"].get("overwritten"), rec["kwargs"]
    out = rebuild_call(rec, dump.tensor).run()
    assert torch.equal(out, a @ b)
    read = dict(rec, kwargs={"out": rec["inputs"][0]})
    with pytest.raises(NotReplayable, match="out="):
        rebuild_call(read, dump.tensor)
