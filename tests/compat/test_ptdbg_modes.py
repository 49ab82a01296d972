"""set_dump_switch's modes, legacy names, Ascend-only options and bad input, on a tiny 3D-ResNet."""
import json
import logging

import pytest
import torch

from opdiff.compat import ptdbg_modes
from opdiff.compat.ptdbg_ascend import (acc_cmp_dump, compare, register_hook, set_dump_path,
                                        set_dump_switch)
from opdiff.errors import ConfigError, OpdiffError
from seed_models import ResNet3d


def record_once(path, **switch):
    torch.manual_seed(0)
    model = ResNet3d()
    set_dump_path(path)
    register_hook(model, acc_cmp_dump)
    set_dump_switch("ON", **switch)
    model(torch.randn(1, 1, 4, 4, 4)).sum().backward()
    set_dump_switch("OFF")


def names(directory):
    """The op records of a dump (leaves, recorded once before their first reader since issue 15,
    are no op: capture/leaves.py)."""
    records = [json.loads(line) for line in (directory / "records.jsonl").open()]
    return [r["name"] for r in records if r.get("kind") != "leaf"]


def test_list_mode_takes_legacy_names(workdir):
    record_once("./d", mode="list", scope=["Tensor___iadd___0_forward", "Functional_conv3d_2_forward"])
    got = names(workdir / "d/ptdbg_dump_v4.0/list/step0/rank0")
    assert sorted(got) == ["Functional.conv3d.2.forward", "Tensor.__iadd__.0.forward"]
    pkl = (workdir / "d/ptdbg_dump_v4.0/list/step0/rank0/list_dump.pkl").read_text().splitlines()
    assert any(json.loads(line)[0] == "Tensor___iadd___0_forward_output.0" for line in pkl)


def test_range_mode_records_from_first_to_last(workdir):
    record_once("./d", mode="range", scope=["Functional_conv3d_1_forward", "Functional_batch_norm_1_forward"])
    got = names(workdir / "d/ptdbg_dump_v4.0/range/step0/rank0")
    assert got[0] == "Functional.conv3d.1.forward"
    assert "Functional.batch_norm.1.forward" in got
    assert "Functional.conv3d.0.forward" not in got and "Functional.conv3d.3.forward" not in got


def test_api_stack_mode_records_everything_with_call_sites(workdir):
    record_once("./d", mode="api_stack")
    directory = workdir / "d/ptdbg_dump_v4.0/step0/rank0"
    got = names(directory)
    assert "Functional.conv3d.0.forward" in got and "Functional.conv3d.0.backward" in got
    assert (directory / "api_stack_dump.pkl").is_file()
    stack_lines = [json.loads(line) for line in (directory / "api_stack_dump.pkl").open()
                   if json.loads(line)[0].endswith("_stack_info")]
    assert stack_lines and all(frames for _, frames in stack_lines)


def test_acl_options_are_accepted_and_explained_once(workdir, caplog):
    caplog.set_level(logging.WARNING, logger="opdiff")
    ptdbg_modes._warned.discard("acl")
    model = ResNet3d()
    set_dump_path("./d")
    register_hook(model, acc_cmp_dump, dump_mode="acl", dump_config="./dump.json")
    register_hook(model, acc_cmp_dump, dump_mode="acl", dump_config="./dump.json")
    set_dump_switch("ON", mode="acl", scope=["Functional_conv3d_0_forward"])
    model(torch.randn(1, 1, 4, 4, 4))
    set_dump_switch("OFF")
    acl = [m for m in caplog.messages if "ACL" in m]
    assert len(acl) == 1 and "only on Ascend" in acl[0]
    assert names(workdir / "d/ptdbg_dump_v4.0/acl/step0/rank0") == ["Functional.conv3d.0.forward"]
    assert (workdir / "d/ptdbg_dump_v4.0/acl/step0/rank0/tensors").is_dir()


def test_a_second_run_into_the_same_dump_is_refused_before_training(workdir):
    record_once("./d")
    before = (workdir / "d/ptdbg_dump_v4.0/step0/rank0/records.jsonl").read_bytes()
    model = ResNet3d()
    set_dump_path("./d")
    register_hook(model, acc_cmp_dump)
    with pytest.raises(ConfigError, match="already holds a dump"):
        set_dump_switch("ON")
    assert (workdir / "d/ptdbg_dump_v4.0/step0/rank0/records.jsonl").read_bytes() == before
    set_dump_path("./d", dump_tag="second_run")         # the fix the message suggests
    set_dump_switch("ON")
    model(torch.randn(1, 1, 4, 4, 4))
    set_dump_switch("OFF")
    assert (workdir / "d/second_run_v4.0/step0/rank0/dump.pkl").is_file()


@pytest.mark.parametrize("call, match", [
    (lambda: set_dump_path(None), "directory"),
    (lambda: set_dump_path("./d", dump_tag=""), "dump_tag"),
    (lambda: register_hook(object(), acc_cmp_dump), "torch.nn.Module"),
    (lambda: register_hook(ResNet3d(), print), "acc_cmp_dump or overflow_check"),
    (lambda: set_dump_switch("on"), "'ON' or 'OFF'"),
    (lambda: compare("npu.pkl", "./out"), "dict"),
    (lambda: compare({"bench_pkl_path": "x"}, "./out"), "npu_pkl_path"),
    (lambda: compare({"npu_pkl_path": "missing.pkl", "bench_pkl_path": "b.pkl"}, "./out"), "does not exist"),
])
def test_bad_input_is_one_clear_error(workdir, call, match):
    with pytest.raises(OpdiffError, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_bad_modes_are_refused(workdir):
    model = ResNet3d()
    set_dump_path("./d")
    register_hook(model, acc_cmp_dump)
    with pytest.raises(ConfigError, match="mode must be one of"):
        set_dump_switch("ON", mode="everything")
    with pytest.raises(ConfigError, match="range"):
        set_dump_switch("ON", mode="range", scope=["Functional_conv3d_0_forward"])
    with pytest.raises(ConfigError, match="api_list"):
        set_dump_switch("ON", mode="api_list")


def test_switch_on_needs_a_live_registered_model(workdir):
    set_dump_path("./fresh")
    register_hook(ResNet3d(), acc_cmp_dump)     # the model is gone right after this line
    with pytest.raises(ConfigError, match="register_hook"):
        set_dump_switch("ON")
