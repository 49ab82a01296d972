"""Seed 001 (ptdbg_ascend PrecisionDebugger style), transcribed with only the import changed.

The seed's model is CenterNet and its finding is "lstm backward input normal, output abnormal";
here an LSTM net runs on CPU on both sides, the "NPU" side with a planted fault in the
backward of VF.lstm.
"""
import csv
import glob
import json

import pytest
import torch
import torch.nn as nn

import opdiff.testing
from seed_models import LstmNet

# The seed's import line, changed from `from ptdbg_ascend import PrecisionDebugger`
from opdiff.compat.ptdbg_ascend import PrecisionDebugger
from opdiff.compat.ptdbg_ascend import compare
from opdiff.errors import ConfigError


def train(dump_path, steps=2, class_level=False):
    torch.manual_seed(0)
    model = LstmNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(3, 5, 6), torch.tensor([0, 1, 2])

    debugger = PrecisionDebugger(dump_path=dump_path, hook_name="dump", step=[0])
    debugger.configure_hook(mode="api_stack")
    # 请勿将以上初始化流程插入到循环代码中
    for _ in range(steps):
        # 下面代码也可以用PrecisionDebugger.start()和PrecisionDebugger.stop()
        (PrecisionDebugger if class_level else debugger).start()

        loss = nn.functional.cross_entropy(model(x), y)      # 需要dump的代码片段1

        (PrecisionDebugger if class_level else debugger).stop()
        debugger.start()

        optimizer.zero_grad()                               # 需要dump的代码片段2
        loss.backward()
        optimizer.step()

        debugger.stop()
        debugger.step()


@pytest.mark.parametrize("class_level", [False, True])
def test_seed001_lstm_backward_fault_is_named(workdir, class_level):
    train("./dump_data_new/cpu", class_level=class_level)
    with opdiff.testing.inject_fault(op="VF.lstm", call=0, phase="backward", scale=1.01) as fault:
        train("./dump_data_new/npu", class_level=class_level)
    assert fault.hits == 1

    for side in ("npu", "cpu"):
        base = workdir / f"dump_data_new/{side}/ptdbg_dump_v4.0"
        assert (base / "step0/rank0/api_stack_dump.pkl").is_file()
        assert (base / "step0/rank0/api_stack_dump").is_dir()
        assert not (base / "step1").exists()               # step=[0]

    dump_result_param = {
        "npu_pkl_path": "./dump_data_new/npu/ptdbg_dump_v4.0/step0/rank0/api_stack_dump.pkl",
        "bench_pkl_path": "./dump_data_new/cpu/ptdbg_dump_v4.0/step0/rank0/api_stack_dump.pkl",
        "npu_dump_data_dir": "./dump_data_new/npu/ptdbg_dump_v4.0/step0/rank0/api_stack_dump",
        "bench_dump_data_dir": "./dump_data_new/cpu/ptdbg_dump_v4.0/step0/rank0/api_stack_dump"
    }
    result = compare(dump_result_param, "./out", stack_mode=True)
    assert result.first_divergence.name == "VF.lstm.0.backward"

    [csv_path] = glob.glob("out/compare_result_*.csv")
    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["NPU Name"].startswith("VF.lstm.0.backward.")]
    verdict = {r["NPU Name"]: r["Accuracy Reached or Not"] for r in rows}
    # lstm反向输入正常，输出异常
    assert verdict["VF.lstm.0.backward.input.0"] == "Yes"
    assert "No" in {v for k, v in verdict.items() if ".output." in k}
    assert any("seed_models.py" in r["NPU_Stack_Info"] for r in rows)


def test_configure_hook_after_start_is_refused(workdir):
    debugger = PrecisionDebugger(dump_path="./d", hook_name="dump")
    debugger.start()
    torch.ones(2).relu()
    debugger.stop()
    with pytest.raises(ConfigError):
        debugger.configure_hook(mode="list", scope=["Torch_relu_0_forward"])
    debugger.step()


def test_api_list_mode_records_only_the_named_apis(workdir):
    debugger = PrecisionDebugger(dump_path="./d", hook_name="dump")
    debugger.configure_hook(mode="api_list", api_list=["relu"])
    debugger.start()
    x = torch.randn(4)
    torch.relu(x * 2).sum()
    debugger.stop()
    debugger.step()
    records = (workdir / "d/ptdbg_dump_v4.0/api_list/step0/rank0/records.jsonl").read_text()
    assert "Torch.relu.0.forward" in records
    assert "Tensor.__mul__" not in records and "Tensor.sum" not in records
    assert (workdir / "d/ptdbg_dump_v4.0/api_list/step0/rank0/api_list_dump.pkl").is_file()


def test_hook_name_must_be_dump_or_overflow_check(workdir):
    with pytest.raises(ConfigError, match="hook_name"):
        PrecisionDebugger(dump_path="./d", hook_name="acc_cmp")


def test_overflow_check_debugger_stops_at_the_origin(workdir):
    import opdiff
    torch.manual_seed(0)
    model = LstmNet()
    x = torch.randn(2, 4, 6)
    debugger = PrecisionDebugger(dump_path="./overflow", hook_name="overflow_check")
    debugger.configure_hook(mode=None, acl_config=None, overflow_nums=1)
    with opdiff.testing.inject_fault(op="Functional.linear", call=1, scale=float("inf")):
        debugger.start()
        with pytest.raises(opdiff.OverflowDetected, match="Functional.linear.1.forward"):
            model(x).sum().backward()
        debugger.stop()
    debugger.step()
    rank_dir = workdir / "overflow/ptdbg_dump_v4.0/step0/rank0"
    names = [json.loads(line)[0] for line in (rank_dir / "dump.pkl").open()]
    assert "Functional_linear_1_forward_output.0" in names
    assert not any(n.startswith("Functional_linear_0_") for n in names)   # finite ops are not dumped
