"""Filters (step, rank, scope, list, data_mode), msprobe's config.json, and bad configuration."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff
from opdiff import ConfigError
from opdiff.store import find_dumps


def _ops(x):
    """A fixed little program: exp, exp, tanh, +, exp, sigmoid."""
    a = x.exp()
    b = x.exp()
    c = torch.tanh(a)
    d = c + b
    e = d.exp()
    return torch.sigmoid(e)


def _run_steps(dbg, steps, model=None):
    x = torch.randn(4, requires_grad=True)
    for _ in range(steps):
        dbg.start(model)
        _ops(x).sum().backward()
        dbg.stop()
        dbg.step()


def test_step_filter_records_only_the_selected_steps(dump_root, read_dump):
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1", step=[1, 3])
    _run_steps(dbg, 4)
    dirs = find_dumps(dump_root)
    assert [d.parent.name for d in dirs] == ["step1", "step3"]
    for step in (1, 3):
        dump = read_dump(dump_root, step=step)
        assert dump.names(phase="forward")[0] == "Tensor.exp.0.forward"   # counters restarted
        assert dump.meta["step"] == step


def test_step_ranges_in_msprobe_syntax(dump_root):
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1", step=["1-2", 4])
    _run_steps(dbg, 5)
    assert [d.parent.name for d in find_dumps(dump_root)] == ["step1", "step2", "step4"]


def test_rank_filter_without_distributed_is_rank_zero(dump_root, tmp_path):
    other = tmp_path / "other"
    _run_steps(opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1", rank=[1]), 1)
    assert not dump_root.exists() or not find_dumps(dump_root)
    _run_steps(opdiff.PrecisionDebugger(dump_path=str(other), level="L1", rank=[0]), 1)
    assert [d.name for d in find_dumps(other)] == ["rank0"]


def test_scope_records_the_range_between_two_names(dump_root, read_dump):
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1", data_mode=["forward"],
                                   scope=["Tensor.exp.1.forward", "Tensor.exp.2.forward"])
    _run_steps(dbg, 1)
    assert read_dump(dump_root).names() == ["Tensor.exp.1.forward", "Torch.tanh.0.forward",
                                            "Tensor.__add__.0.forward", "Tensor.exp.2.forward"]


def test_scope_keeps_the_backward_of_every_op_in_range(dump_root, read_dump):
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1",
                                   scope=["Tensor.exp.1.forward", "Tensor.exp.2.forward"])
    _run_steps(dbg, 1)
    backward = set(read_dump(dump_root).names(phase="backward"))
    assert backward == {"Tensor.exp.1.backward", "Torch.tanh.0.backward", "Tensor.__add__.0.backward",
                        "Tensor.exp.2.backward"}


def test_list_selects_by_name_and_by_substring(dump_root, read_dump, tmp_path):
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L1", list=["Torch.tanh"])
    _run_steps(dbg, 1)
    assert read_dump(dump_root).names() == ["Torch.tanh.0.forward", "Torch.tanh.0.backward"]
    exact = tmp_path / "exact"
    dbg = opdiff.PrecisionDebugger(dump_path=str(exact), level="L1", list=["Tensor.exp.1.forward", "sigmoid"])
    _run_steps(dbg, 1)
    assert read_dump(exact).names() == ["Tensor.exp.1.forward", "Torch.sigmoid.0.forward",
                                        "Torch.sigmoid.0.backward"]
    legacy = tmp_path / "legacy"   # ptdbg_ascend's spelling of the same name
    dbg = opdiff.PrecisionDebugger(dump_path=str(legacy), level="L1", list=["Tensor___add___0_forward"])
    _run_steps(dbg, 1)
    assert read_dump(legacy).names() == ["Tensor.__add__.0.forward"]


def test_list_selects_modules_at_l0(dump_root, read_dump, model_cases):
    model, inputs, loss_fn = model_cases["cnn"].build()
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L0", list=["Module.layer1.0.conv1"])
    dbg.start(model)
    loss_fn(model(*inputs)).backward()
    dbg.stop()
    dbg.step()
    names = read_dump(dump_root).names()
    assert "Module.layer1.0.conv1.Conv2d.forward.0" in names
    assert "Module.layer1.0.conv1.Conv2d.backward.0" in names
    # (and the parameters it reads, recorded once before it: see capture/leaves.py)
    assert all(n.startswith(("Module.layer1.0.conv1.", "Parameter.layer1.0.conv1."))
               for n in names), names
    assert "Parameter.layer1.0.conv1.weight.0.forward" in names


@pytest.mark.parametrize("mode", ["forward", "backward", "input", "output"])
def test_data_mode(mode, dump_root, read_dump, model_cases):
    model, inputs, loss_fn = model_cases["inplace_relu"].build()
    with opdiff.dump(model, dump_root, level="mix", data_mode=[mode]):
        loss_fn(model(*inputs)).backward()
    dump = read_dump(dump_root)
    phases = {r["phase"] for r in dump.records}
    assert dump.records
    if mode == "forward":
        assert phases == {"forward"}
    elif mode == "backward":
        assert phases == {"backward"}
        assert {r["kind"] for r in dump.records} >= {"api", "module", "param_grad"}
    else:
        phases_expected = {"forward", "backward"}
        assert phases == phases_expected
        other = "outputs" if mode == "input" else "inputs"
        own = "inputs" if mode == "input" else "outputs"
        for r in dump.records:
            assert not r.get(other), f"{r['name']} keeps {other} with data_mode={mode}"
        assert any(r.get(own) for r in dump.records)


def _config(tmp_path, body: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(body))
    return str(path)


def test_msprobe_config_json(dump_root, read_dump, tmp_path):
    cfg = _config(tmp_path, {
        "task": "tensor", "dump_path": str(dump_root), "rank": [], "step": [0], "level": "L1",
        "is_deterministic": False, "enable_dataloader": False,
        "tensor": {"scope": [], "list": ["Torch.tanh"], "data_mode": ["forward"], "file_format": "npy"},
        "statistics": {"scope": [], "list": ["never_matches"], "data_mode": ["all"]},
    })
    dbg = opdiff.PrecisionDebugger(config_path=cfg)
    assert dbg.config.task == "tensor" and dbg.config.level == "L1"
    _run_steps(dbg, 2)
    dump = read_dump(dump_root)
    assert dump.names() == ["Torch.tanh.0.forward"]          # the task's own section applies
    assert "key" in dump.records[0]["outputs"][0]              # task=tensor saves tensors
    assert [d.parent.name for d in find_dumps(dump_root)] == ["step0"]
    assert dump.meta["config"]["task"] == "tensor"


def test_config_json_arguments_given_to_the_debugger_win(dump_root, tmp_path):
    cfg = _config(tmp_path, {"task": "statistics", "dump_path": "/nonexistent/elsewhere", "level": "L0"})
    dbg = opdiff.PrecisionDebugger(config_path=cfg, dump_path=str(dump_root), level="L1")
    assert dbg.config.level == "L1" and dbg.config.dump_path == str(dump_root)


@pytest.mark.parametrize("body, key", [
    ({"task": "statistics", "levle": "L1"}, "levle"),
    ({"task": "statistics", "statistics": {"scop": []}}, "scop"),
    ({"task": "statistics", "level": "L3"}, "level"),
    ({"task": "dump_everything"}, "task"),
    ({"task": "statistics", "step": [-1]}, "step"),
    ({"task": "statistics", "step": ["4-2"]}, "step"),
    ({"task": "statistics", "statistics": {"data_mode": ["fwd"]}}, "data_mode"),
    ({"task": "statistics", "statistics": {"scope": ["only_one"]}}, "scope"),
    ({"task": "overflow_check", "overflow_check": {"overflow_nums": 0}}, "overflow_nums"),
    ({"task": "statistics", "rank": "0"}, "rank"),
])
def test_bad_config_json_names_the_key(body, key, tmp_path):
    with pytest.raises(ConfigError) as err:
        opdiff.PrecisionDebugger(config_path=_config(tmp_path, body))
    message = str(err.value)
    assert key in message
    assert "\n" not in message


@pytest.mark.parametrize("kwargs, key", [
    ({"level": "L3"}, "level"),
    ({"task": "statistic"}, "task"),
    ({"data_mode": ["inputs"]}, "data_mode"),
    ({"scope": ["a", "b", "c"]}, "scope"),
    ({"step": "first"}, "step"),
    ({"summary_mode": "md5"}, "summary_mode"),
])
def test_bad_debugger_arguments_name_the_key(kwargs, key, dump_root):
    with pytest.raises(ConfigError) as err:
        opdiff.PrecisionDebugger(dump_path=str(dump_root), **kwargs)
    assert key in str(err.value)


def test_config_file_problems_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        opdiff.PrecisionDebugger(config_path=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"task": "statistics",}')
    with pytest.raises(ConfigError, match="JSON"):
        opdiff.PrecisionDebugger(config_path=str(bad))


def test_an_existing_dump_is_never_overwritten(dump_root, read_dump):
    with opdiff.dump(None, dump_root, level="L1"):
        torch.ones(2).exp()
    before = {p: p.read_bytes() for p in dump_root.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="already"):
        with opdiff.dump(None, dump_root, level="L1"):
            torch.ones(2).sin()
    after = {p: p.read_bytes() for p in dump_root.rglob("*") if p.is_file()}
    assert after == before


def test_dump_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("user data")
    with pytest.raises(ConfigError, match="file"):
        opdiff.PrecisionDebugger(dump_path=str(f))
    assert f.read_text() == "user data"


def test_module_levels_need_a_model(dump_root):
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="L0")
    with pytest.raises(ConfigError, match="model"):
        dbg.start()



def test_scope_ending_at_a_module_includes_that_modules_ops(dump_root, read_dump, model_cases):
    # msprobe: a scope of module names runs from the start of the first to the end of the last.
    model, inputs, loss_fn = model_cases["cnn"].build()
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump_root), level="mix", data_mode=["forward"],
                                   scope=["Module.layer1.0.conv2.Conv2d.forward.0",
                                          "Module.pool.AdaptiveAvgPool2d.forward.0"])
    dbg.start(model)
    loss_fn(model(*inputs)).backward()
    dbg.stop()
    dbg.step()
    names = read_dump(dump_root).names()
    # what the scope starts from (made before it opened), then what its first op reads first
    assert names[:2] == ["Input.layer1.0.conv2.input0.0.forward",
                         "Parameter.layer1.0.conv2.weight.0.forward"]
    names = [n for n in names if not n.startswith(("Parameter.", "Input."))]
    assert names[0] == "Functional.conv2d.2.forward"            # first module's own op
    assert "Functional.adaptive_avg_pool2d.0.forward" in names  # last module's own op
    assert names[-1] == "Module.pool.AdaptiveAvgPool2d.forward.0"
    assert not any(n.startswith(("Module.fc", "Functional.linear", "Tensor.pow")) for n in names)


def test_a_dump_path_that_cannot_be_created_is_a_config_error(tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("user data")
    with pytest.raises(ConfigError) as err:
        with opdiff.dump(None, blocker / "dump", level="L1"):
            torch.ones(2).exp()
    assert "dump_path" in str(err.value) and "\n" not in str(err.value)
    assert blocker.read_text() == "user data"
