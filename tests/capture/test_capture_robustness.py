"""Never break the user's run: capture failures are logged once and recorded, odd models work."""
from __future__ import annotations

import copy
import errno
import logging

import pytest
import torch
import torch.nn as nn

import opdiff
from opdiff.capture import stats as capture_stats


class _Unprintable:
    def __repr__(self):
        raise RuntimeError("repr exploded")


class _ExplodingList(list):
    """A list argument whose iteration raises (a lazily-evaluated container gone wrong)."""

    def __iter__(self):
        raise RuntimeError("iteration exploded")


class _TakesExtras(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, extra=None, more=None):
        return self.lin(x).relu()


def _opdiff_warnings(caplog):
    return [r for r in caplog.records if r.name == "opdiff" and r.levelno >= logging.WARNING]


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _TakesExtras()

    def forward(self, x, extra):
        return self.inner(x, extra)


def test_an_argument_whose_repr_raises_is_recorded_safely(dump_root, read_dump):
    model = _Outer()
    x = torch.randn(2, 3)
    with opdiff.dump(model, dump_root, level="mix"):
        y = model(x, _Unprintable())
        y.sum().backward()
    dump = read_dump(dump_root)
    rec = dump["Module.inner._TakesExtras.forward.0"]
    assert rec["inputs"][0]["type"] == "tensor"
    assert rec["inputs"][1]["type"] == "object"
    assert "repr" not in rec.get("error", "")
    assert torch.equal(y, model(x, None))


def test_a_failure_inside_capture_is_logged_once_recorded_and_the_step_completes(dump_root, read_dump,
                                                                                caplog):
    model = _TakesExtras()
    x = torch.randn(2, 3)
    caplog.set_level(logging.WARNING, logger="opdiff")
    want = model(x)
    with opdiff.dump(None, dump_root, level="L1"):
        for _ in range(3):
            a = torch.cat(_ExplodingListWrapper.make(x))   # capture cannot walk this argument
        y = model(x)
        y.sum().backward()
    assert torch.equal(y, want)
    assert torch.equal(a, torch.cat([x, x]))
    warnings = _opdiff_warnings(caplog)
    assert len(warnings) == 1, [w.getMessage() for w in warnings]
    dump = read_dump(dump_root)
    # The step's other ops are all there, and the failure is on the record where it happened.
    assert "Functional.linear.0.forward" in dump.by_name
    errors = [r for r in dump.records if "error" in r]
    assert errors and "exploded" in errors[0]["error"]


class _ExplodingListWrapper:
    @staticmethod
    def make(x):
        # torch.cat accepts any sequence it can index; opdiff's describer iterates it.
        class Seq(_ExplodingList):
            def __getitem__(self, i):
                return list.__getitem__(self, i)
        s = Seq()
        list.append(s, x)
        list.append(s, x)
        return s


def test_a_broken_statistics_kernel_does_not_break_training(dump_root, read_dump, caplog, monkeypatch,
                                                            model_cases):
    case = model_cases["cnn"]
    ref_model, (x,), loss_fn = case.build()
    loss_fn(ref_model(x)).backward()

    def broken(*args, **kwargs):
        raise FloatingPointError("statistics kernel failed")

    for name in ("cpu_stats", "stat_vector", "device_vector", "_reduce_small"):
        if hasattr(capture_stats, name):
            monkeypatch.setattr(capture_stats, name, broken)
    caplog.set_level(logging.WARNING, logger="opdiff")
    model, (x,), loss_fn = case.build()
    with opdiff.dump(model, dump_root, level="mix"):
        loss = loss_fn(model(x))
        loss.backward()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p.grad, q.grad)
    assert len(_opdiff_warnings(caplog)) == 1
    dump = read_dump(dump_root)
    assert dump.records, "records of the step are kept even without statistics"
    assert any("statistics kernel failed" in r.get("error", "") for r in dump.records)


def test_disk_full_stops_dumping_and_training_goes_on(dump_root, caplog, model_cases):
    model, (x,), loss_fn = model_cases["cnn"].build()
    caplog.set_level(logging.WARNING, logger="opdiff")

    def full_disk(data):
        raise OSError(errno.ENOSPC, "No space left on device")

    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="mix", task="tensor")
    for step in range(2):
        dbg.start(model)
        if step == 0:
            dbg.session.writer._records.write = full_disk
        loss_fn(model(x)).backward()
        dbg.stop()
        dbg.step()
    assert any("dump" in w.getMessage() for w in _opdiff_warnings(caplog))


def test_user_exceptions_pass_through_unchanged_and_the_dump_closes(dump_root, read_dump):
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        with opdiff.dump(None, dump_root, level="L1"):
            a.exp()
            torch.mm(a, b)
    dump = read_dump(dump_root)
    assert dump.names()[0] == "Tensor.exp.0.forward"
    # The debugger is not left running: a new one can start.
    with opdiff.dump(None, dump_root / "again", level="L1"):
        a.sin()


def test_tuple_dict_namedtuple_and_non_tensor_outputs(model_cases, dump_root, read_dump):
    model, (x,), loss_fn = model_cases["multi_output"].build()
    ref = copy.deepcopy(model)
    with opdiff.dump(model, dump_root, level="mix", task="tensor"):
        out = model(x)
        loss_fn(out).backward()
    assert out[3] == 3 and out[4] == "dict" and out[5] is None
    assert type(model.pair(model.a(x))).__name__ == "Pair"   # outputs untouched
    dump = read_dump(dump_root)
    pair = dump["Module.pair.PairHead.forward.0"]["outputs"]
    assert [d["type"] for d in pair] == ["tensor", "tensor"]
    head = dump["Module.dicthead.DictHead.forward.0"]["outputs"][0]
    assert head["type"] == "dict"
    assert head["items"]["count"] == {"type": "int", "value": 3}
    assert head["items"]["tag"] == {"type": "str", "value": "dict"}
    assert head["items"]["scale"] == {"type": "float", "value": 0.5}
    assert head["items"]["logits"]["shape"] == [3, 3]
    # Backward reaches modules with container outputs.
    assert "Module.pair.PairHead.backward.0" in dump.by_name
    assert "Module.dicthead.DictHead.backward.0" in dump.by_name
    loss_fn(ref(x)).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("level", ["mix", "L2"])
def test_inference_without_autograd(context, level, model_cases, dump_root, read_dump, check_stats):
    model, (x,), _ = model_cases["cnn"].build()
    model.eval()
    with torch.no_grad():
        want = model(x)
    ctx = torch.no_grad() if context == "no_grad" else torch.inference_mode()
    with opdiff.dump(model, dump_root, level=level, task="tensor"):
        with ctx:
            out = model(x)
    assert torch.equal(out, want)
    dump = read_dump(dump_root)
    assert not [r["error"] for r in dump.records if "error" in r]
    assert {r["phase"] for r in dump.records} == {"forward"}
    # Under inference_mode aten sees the composite conv2d, under no_grad its decomposition.
    conv = [r for r in dump.records
            if r["op"] in ("Functional.conv2d", "Aten.convolution", "Aten.conv2d")]
    assert len(conv) == 3
    check_stats(conv[0]["inputs"][0], x, what="first conv input")
    assert torch.equal(dump.tensor(conv[0]["inputs"][0]), x)


def _bf16_step_matches_plain(case, dump_root, **options):
    """One autocast-bf16 training step with and without capture: loss and gradients bitwise equal."""
    model, (x,), loss_fn = case.build()
    ref = copy.deepcopy(model)
    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = loss_fn(ref(x))
    want.backward()
    torch.manual_seed(5)
    with opdiff.dump(model, dump_root, **options):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x))
        loss.backward()
    assert torch.equal(loss, want)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_autocast_bf16_training(model_cases, dump_root, read_dump):
    _bf16_step_matches_plain(model_cases["transformer"], dump_root, level="mix")
    dump = read_dump(dump_root)
    assert not [r["error"] for r in dump.records if "error" in r]
    lin = dump["Functional.linear.0.forward"]
    assert lin["inputs"][0]["dtype"] == "float32" and lin["outputs"][0]["dtype"] == "bfloat16"
    assert dump.with_op("Functional.linear", "backward")


def test_inplace_relu_model_trains_identically(model_cases, dump_root, read_dump):
    model, (x,), loss_fn = model_cases["inplace_relu"].build()
    ref = copy.deepcopy(model)
    loss_fn(ref(x)).backward()
    with opdiff.dump(model, dump_root, level="mix", task="tensor"):
        loss_fn(model(x)).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)
    dump = read_dump(dump_root)
    act = dump["Module.act.ReLU.forward.0"]
    assert dump.tensor(act["inputs"][0]).min() < 0 <= dump.tensor(act["outputs"][0]).min()


class _FailsOnce(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        if self.calls == 1:
            raise ValueError("first call fails")   # e.g. an OOM the user catches and retries
        return y


def test_a_module_forward_that_raises_does_not_corrupt_module_attribution(dump_root, read_dump):
    model = nn.Sequential(_FailsOnce(), nn.Linear(3, 2))
    x = torch.randn(2, 3)
    with opdiff.dump(model, dump_root, level="mix"):
        with pytest.raises(ValueError):
            model(x)
        model(x).sum().backward()
        x.exp()
    dump = read_dump(dump_root)
    # Ops after the failed call run outside it.
    assert dump["Tensor.sum.0.forward"]["module"] is None
    assert dump["Tensor.exp.0.forward"]["module"] is None
    assert dump["Module.1.Linear.forward.0"]["module"] is None
    assert dump["Module.0._FailsOnce.forward.1"]["module"] is None
    assert dump["Module.0.lin.Linear.forward.1"]["module"] == "Module.0._FailsOnce.forward.1"


@pytest.mark.parametrize("level", ["L1", "L2"])
def test_torch_func_transforms_are_captured(level, dump_root, read_dump, caplog, check_stats):
    # torch.func (vmap for per-sample work, grad for functional training) wraps tensors; capture
    # must read the values underneath instead of failing on them.
    caplog.set_level(logging.WARNING, logger="opdiff")
    x = torch.randn(4, 3)
    w = torch.randn(3, 2)

    def per_sample(xi):
        return torch.tanh(xi @ w).sum()

    want_v = torch.func.vmap(per_sample)(x)
    want_g = torch.func.grad(lambda w_: torch.tanh(x @ w_).sum())(w)
    with opdiff.dump(None, dump_root, level=level):
        v = torch.func.vmap(per_sample)(x)
        g = torch.func.grad(lambda w_: torch.tanh(x @ w_).sum())(w)
    assert torch.equal(v, want_v) and torch.equal(g, want_g)
    assert not _opdiff_warnings(caplog), [w.getMessage() for w in _opdiff_warnings(caplog)]
    dump = read_dump(dump_root)
    assert not [r["error"] for r in dump.records if "error" in r]
    if level == "L1":
        # Inside vmap the matmul sees one sample at a time; its record describes the whole batch.
        first = dump["Tensor.__matmul__.0.forward"]
        assert first["inputs"][1]["shape"] == [3, 2]
        check_stats(first["inputs"][1], w, what="weight inside vmap")


@pytest.mark.parametrize("level", ["L0", "L1", "mix", "L2"])
def test_backward_after_the_dump_closed(level, model_cases, dump_root, read_dump):
    # Forward recorded, backward run after the block: the hooks left on the graph stay silent.
    model, (x,), loss_fn = model_cases["transformer"].build()
    ref = copy.deepcopy(model)
    torch.manual_seed(3)
    loss_fn(ref(x)).backward()
    torch.manual_seed(3)
    with opdiff.dump(model, dump_root, level=level):
        loss = loss_fn(model(x))
    loss.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)
    dump = read_dump(dump_root)
    assert {r["phase"] for r in dump.records} == {"forward"}


@pytest.mark.parametrize("level", ["L0", "L1", "mix", "L2"])
def test_autocast_training_is_bitwise_unchanged(level, model_cases, dump_root):
    _bf16_step_matches_plain(model_cases["cnn"], dump_root, level=level, task="tensor")


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_no_global_module_hook_survives_the_dump(level, dump_root):
    # Left-over global hook state makes every later torch.compile(module) in the process warn
    # "Using torch.compile(module) when there are global hooks on modules".
    from torch.nn.modules import module as nn_module
    registries = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
                  "_global_forward_hooks", "_global_forward_hooks_always_called",
                  "_global_forward_hooks_with_kwargs")

    def global_hooks():
        return {name: set(getattr(nn_module, name)) for name in registries}

    before = global_hooks()
    model = nn.Sequential(nn.Linear(2, 2))
    with opdiff.dump(model, dump_root, level=level):
        model(torch.ones(1, 2)).sum().backward()
    after = global_hooks()
    assert after == before, {k: after[k] - before[k] for k in registries if after[k] != before[k]}


class _Cycle:
    def __init__(self):
        self.me = self


def test_objects_frozen_during_a_step_are_collectable_after_it(dump_root):
    import gc
    import weakref
    assert gc.get_freeze_count() == 0
    cycle = _Cycle()                       # garbage only the cycle collector can free
    ref = weakref.ref(cycle)
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1")
    dbg.start()
    assert gc.get_freeze_count() > 0        # older objects kept out of full collections
    del cycle
    gc.collect()
    assert ref() is not None                # frozen: not collected during the step
    torch.ones(3).exp()
    dbg.stop()
    dbg.step()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None                    # the step is over: collected as usual


def test_a_program_that_froze_objects_itself_keeps_them_frozen(dump_root):
    import gc
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with opdiff.dump(None, str(dump_root), level="L1"):
            torch.ones(3).exp()
        # still frozen (unfreezing would make it 0); a few frozen objects died meanwhile
        assert frozen - 1000 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("level", ["mix", "L2"])
def test_ops_captured_into_a_cuda_graph_are_left_alone(level, dump_root, read_dump, monkeypatch):
    # Ops captured into a CUDA graph run on each replay, not when Python calls them: recording
    # them would capture statistics kernels into the user's graph, and fetching the statistics
    # (a host sync) would invalidate the capture. No CUDA here: the capture state is simulated.
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    with opdiff.dump(model, dump_root, level=level):
        model(x).sum()
        capturing["on"] = True          # torch.cuda.graph(g) entered: a graph is captured
        model(x * 2).sum().backward()   # (whole-network capture: backward too)
        capturing["on"] = False
        y = model(x).tanh()
        loss = y.sum()
        capturing["on"] = True          # a backward captured on its own: its hooks fire now
        loss.backward()
        capturing["on"] = False
    names = [r["name"] for r in read_dump(dump_root).records]
    assert not [n for n in names if "backward" in n or "parameters_grad" in n], names
    if level == "mix":
        assert [n for n in names if n.startswith("Module.0.Linear.forward")] == \
            ["Module.0.Linear.forward.0", "Module.0.Linear.forward.1"]
        assert "Tensor.__mul__.0.forward" not in names and "Tensor.tanh.0.forward" in names
        assert [n for n in names if n.startswith("Tensor.sum")] == \
            ["Tensor.sum.0.forward", "Tensor.sum.1.forward"]
    else:
        assert "Aten.mul.0.forward" not in names and "Aten.tanh.0.forward" in names
        assert [n for n in names if n.startswith("Aten.sum")] == ["Aten.sum.0.forward",
                                                                  "Aten.sum.1.forward"]
