"""Seed 000 (3D_ResNet, ptdbg_ascend hook style), transcribed with only the import changed.

The "NPU" run is the same CPU model with a planted fault in the second `out += residual`
(its result negated: a broken in-place add). The walkthrough is followed step by step:
dump both runs, compare, filter Cosine < 0.99 and MaxAbsErr > 0.001, find iadd, dump its
stack in stack mode, land on `out += residual`, and check that the batchnorm output feeding
it still agrees.
"""
import csv
import glob
import json
import logging
import os
import shutil

import pytest
import torch
import torch.nn as nn

import opdiff
import opdiff.testing
from seed_models import ResNet3d

# The seed's import line, changed from `from ptdbg_ascend import ...`
from opdiff.compat.ptdbg_ascend import register_hook, overflow_check, seed_all, set_dump_path, set_dump_switch, acc_cmp_dump  # noqa: E501
from opdiff.compat.ptdbg_ascend import compare

PLANTED = dict(op="Tensor.__iadd__", call=1, phase="forward", scale=-1.0)
CULPRIT = "Tensor.__iadd__.1.forward"


def create_model():
    return ResNet3d()


def train_epoch(model, optimizer, data):
    x, y = data
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main_overflow(num_epochs=1):
    seed_all()
    model = create_model()
    data = (torch.randn(2, 1, 6, 6, 6), torch.tensor([0, 2]))
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    set_dump_path("./data/dump", dump_tag='npu_overflow')    # 设置dump路径
    register_hook(model, overflow_check, overflow_nums=1)    # 使能溢出检测
    for _epoch in range(1, num_epochs + 1):
        train_epoch(model, optimizer, data)


def main(dump_path, switch=("ON",), switch_kwargs=None, num_epochs=1):
    seed_all()
    model = create_model()
    data = (torch.randn(2, 1, 6, 6, 6), torch.tensor([0, 2]))
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)

    set_dump_path(dump_path)    # 设置dump路径
    register_hook(model, acc_cmp_dump)    # 添加hook函数和数据比对dump开关

    set_dump_switch(*switch, **(switch_kwargs or {}))
    for _epoch in range(1, num_epochs + 1):
        train_epoch(model, optimizer, data)
    set_dump_switch("OFF")


def _floats(row, *keys):
    try:
        return [float(row[k]) for k in keys]
    except ValueError:      # "N/A": a metric that does not apply (0-d tensors)
        return None


def test_overflow_check_stops_training_at_the_origin_and_writes_the_pkl(workdir):
    with opdiff.testing.inject_fault(op="Functional.conv3d", call=2, scale=float("inf")):
        with pytest.raises(opdiff.OverflowDetected) as caught:
            main_overflow()
    assert "Functional.conv3d.2.forward" in str(caught.value)
    rank_dir = workdir / "data/dump/npu_overflow_v4.0/step0/rank0"
    lines = [json.loads(line) for line in (rank_dir / "dump.pkl").read_text().splitlines()]
    names = [line[0] for line in lines]
    assert "Functional_conv3d_2_forward_output.0" in names
    output = lines[names.index("Functional_conv3d_2_forward_output.0")]
    assert output[5][0] == float("inf") or output[5][0] != output[5][0]   # max is inf or NaN


def test_overflow_check_of_a_healthy_run_records_no_origin(workdir):
    main_overflow()
    set_dump_path("./elsewhere")          # ends the recording; its files are written
    records = (workdir / "data/dump/npu_overflow_v4.0/step0/rank0/records.jsonl").read_text()
    assert records.strip() == ""


def test_seed000_walkthrough_finds_iadd_and_its_source_line(workdir, caplog):
    main("./dump_data_new/cpu")
    with opdiff.testing.inject_fault(**PLANTED) as fault:
        main("./dump_data_new/npu")
    assert fault.hits == 1

    # The files the seed's compare dictionary points at.
    for side in ("npu", "cpu"):
        rank_dir = workdir / f"dump_data_new/{side}/ptdbg_dump_v4.0/step0/rank0"
        assert (rank_dir / "dump.pkl").is_file()
        assert (rank_dir / "dump").is_dir()
        first = json.loads((rank_dir / "dump.pkl").read_text().splitlines()[0])
        assert isinstance(first[0], str)

    dump_result_param = {
        "npu_pkl_path": "./dump_data_new/npu/ptdbg_dump_v4.0/step0/rank0/dump.pkl",
        "bench_pkl_path": "./dump_data_new/cpu/ptdbg_dump_v4.0/step0/rank0/dump.pkl",
        "npu_dump_data_dir": "./dump_data_new/npu/ptdbg_dump_v4.0/step0/rank0/dump",
        "bench_dump_data_dir": "./dump_data_new/cpu/ptdbg_dump_v4.0/step0/rank0/dump",
    }
    result = compare(dump_result_param, "./out")
    assert result.first_divergence.name == CULPRIT

    # A dump.pkl alone, as the real ptdbg_ascend leaves it (no opdiff dump beside it), compares too.
    for side in ("npu", "cpu"):
        os.makedirs(f"legacy/{side}")
        shutil.copy(f"dump_data_new/{side}/ptdbg_dump_v4.0/step0/rank0/dump.pkl", f"legacy/{side}/dump.pkl")
    from_pkl = compare({"npu_pkl_path": "legacy/npu/dump.pkl", "bench_pkl_path": "legacy/cpu/dump.pkl"},
                       "./out_pkl")
    assert from_pkl.first_divergence.name == CULPRIT
    assert from_pkl.first_divergence.location.code.startswith("out += residual")

    # 按余弦相似度小于0.99、最大绝对值误差大于0.001进行筛选
    [csv_path] = glob.glob("out/compare_result_*.csv")
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    flagged = [r for r in rows if (v := _floats(r, "Cosine", "MaxAbsErr")) and v[0] < 0.99 and v[1] > 0.001]
    assert flagged, "the planted fault must show in the filtered CSV"
    assert flagged[0]["NPU Name"].startswith(CULPRIT)          # 第一个存在问题的是iadd

    # iadd's real input is bn2's output: it agrees (cosine 1, max abs err near 0).
    iadd_at = next(i for i, r in enumerate(rows) if r["NPU Name"].startswith(CULPRIT))
    bn_out = [r for r in rows[:iadd_at] if r["NPU Name"].startswith("Functional.batch_norm.")
              and ".forward.output.0" in r["NPU Name"]][-1]
    cosine, max_abs = _floats(bn_out, "Cosine", "MaxAbsErr")
    assert cosine > 0.9999 and max_abs < 1e-6

    # 修改set_dump_switch所在行代码，使能stack模式dump (and run the NPU side again)
    caplog.set_level(logging.INFO, logger="opdiff")
    with opdiff.testing.inject_fault(**PLANTED):
        main("./dump_data_new/npu", ("ON",), dict(mode="stack", scope=['Tensor___iadd___forward']))
    stack_dir = workdir / "dump_data_new/npu/ptdbg_dump_v4.0/stack/step0/rank0"
    stacks = json.loads((stack_dir / "stack.json").read_text())
    assert set(stacks) >= {"Tensor.__iadd__.0.forward", CULPRIT}
    assert all(name.startswith("Tensor.__iadd__.") for name in stacks)
    frame = stacks[CULPRIT][0]
    assert frame["code"].startswith("out += residual")
    assert frame["file"].endswith("seed_models.py")
    legacy = [json.loads(line) for line in (stack_dir / "stack_dump.pkl").read_text().splitlines()]
    by_name = {line[0]: line[1] for line in legacy}
    assert by_name["Tensor___iadd___1_forward_stack_info"][0][3].startswith("out += residual")
    assert any("out += residual" in m for m in caplog.messages)
    # Stack mode records call sites, not tensors.
    assert not (stack_dir / "tensors").exists()


def test_each_on_off_region_is_one_step(workdir):
    seed_all()
    model = create_model()
    x = torch.randn(1, 1, 4, 4, 4)
    set_dump_path("./regions")
    register_hook(model, acc_cmp_dump)
    for _ in range(2):
        set_dump_switch("ON")
        model(x)
        set_dump_switch("OFF")
    model(x)                                 # outside any region: not recorded
    base = workdir / "regions/ptdbg_dump_v4.0"
    assert sorted(p.name for p in base.iterdir()) == ["step0", "step1"]
    for step in ("step0", "step1"):
        names = [json.loads(line)["name"] for line in (base / step / "rank0/records.jsonl").open()]
        assert names.count("Functional.conv3d.0.forward") == 1
        assert "Functional.conv3d.5.forward" not in names
