"""`--device`: any torch device string is accepted if this machine can run it; a garbage string,
a device this torch lacks, a missing extension (npu) or meta is one line and exit 2, before OUT
is touched. A recorded `device=` argument follows the device the call is re-run on."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from checkmodels import dump

from opdiff.check import check_dump
from opdiff.check.device import usable_device
from opdiff.cli import main
from opdiff.comparison.replay.calls import rebuild_call
from opdiff.errors import ConfigError
from opdiff.store.schema import complete


@pytest.fixture(scope="module")
def stats(tmp_path_factory):
    return dump("cnn", tmp_path_factory.mktemp("stats") / "d", task="statistics")


def test_cpu_strings_are_usable():
    assert usable_device("cpu") == "cpu"
    assert usable_device(" cpu:0 ") == "cpu:0"


@pytest.mark.parametrize("text,words", [
    ("garbage", "is not a torch device"),
    ("cuda:", "is not a torch device"),
    ("", "is not a torch device"),
    ("meta", "computes no values"),
])
def test_bad_device_strings_are_refused(text, words):
    with pytest.raises(ConfigError, match=words):
        usable_device(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_unavailable_cuda_is_refused():
    for text in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match="is not available here"):
            usable_device(text)


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu installed")
def test_npu_without_torch_npu_says_what_is_missing():
    with pytest.raises(ConfigError, match="needs torch_npu"):
        usable_device("npu:0")


@pytest.mark.parametrize("device", ["garbage"] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_cli_bad_device_is_one_line_exit_2_and_out_kept(stats, tmp_path, capsys, device):
    out = tmp_path / "out"
    assert main(["check", str(stats), "-o", str(out), "--no-progress"]) == 2   # no --device
    capsys.readouterr()
    assert main(["check", str(stats), "-o", str(out), "--device", "cpu", "--no-progress"]) == 0
    assert (out / "summary.json").exists()
    capsys.readouterr()
    assert main(["check", str(stats), "-o", str(out), "--device", device, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"--device {device!r}" in err
    assert (out / "summary.json").exists()          # refused before OUT was cleared


def test_device_index_is_kept_in_the_result(stats):
    result = check_dump(stats, device="cpu:0", names=["Functional.conv2d"])
    assert result.device == "cpu:0" and result.mode == "statistics"
    assert result.checked and not result.failures
    assert any("re-run on cpu:0" in n for n in result.notes)


def test_device_on_a_tensor_dump_is_noted_not_used(tmp_path):
    path = dump("cnn", tmp_path / "d")
    result = check_dump(path, device="cpu", names=["Functional.conv2d.0.forward"])
    assert result.device is None and result.mode == "tensor"
    assert any("--device cpu not used" in n for n in result.notes), result.notes


def test_a_recorded_device_argument_follows_the_replay_device():
    record = complete({"name": "Torch.arange.0.forward", "op": "Torch.arange",
                       "inputs": [{"type": "int", "value": 5}],
                       "kwargs": {"device": {"type": "device", "value": "npu:0"}}})
    assert rebuild_call(record, lambda key: None).run().device == torch.device("cpu")
    # meta stands for any other device here: the argument is the replay's device, not the dump's
    assert rebuild_call(record, lambda key: None, device="meta").run().device.type == "meta"
