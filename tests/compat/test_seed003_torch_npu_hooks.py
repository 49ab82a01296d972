"""Seed 003 (torch_npu.hooks, PyTorch 1.8.1 era), transcribed with only the imports changed.

The seed compares torchvision's resnet50 on CPU and NPU; here a small ResNet-style CNN runs on
CPU twice, the "NPU" copy with a planted fault in one batch_norm call. `.npu()` calls and
`torch_npu._C._npu_setDevice(0)` are the only lines dropped: there is no NPU here.
"""
import copy
import csv
import json
import os
import shutil

import pytest
import torch
import torch.nn as nn

import opdiff.testing
from seed_models import ResNet2d

# The seed's import lines, changed from `torch_npu.hooks` and `torch_npu.hooks.tools`
from opdiff.compat.torch_npu_hooks import set_dump_path, seed_all, register_acc_cmp_hook
from opdiff.compat.torch_npu_hooks import compare
from opdiff.errors import ConfigError

PLANTED = dict(op="Functional.batch_norm", call=2, phase="forward", scale=1 + 1e-3)
CULPRIT = "Functional.batch_norm.2.forward"
COLUMNS = ["Name", "Npu Tensor Dtype", "Bench Tensor Dtype", "Npu Tensor Shape", "Bench Tensor Shape",
           "Cosine", "RMSE", "MAPE"]


def seed003_script():
    """The seed's quick-start sample."""
    # 选取需要的模型
    model_cpu = ResNet2d()
    model_cpu.eval()
    model_npu = copy.deepcopy(model_cpu)
    model_npu.eval()

    # 对该计算进行hook注入和数据dump
    register_acc_cmp_hook(model_cpu)
    register_acc_cmp_hook(model_npu)
    seed_all()

    inputs = torch.randn(1, 3, 24, 24)
    labels = torch.randn(1).long()
    criterion = nn.CrossEntropyLoss()

    # 在cpu上计算，在计算输出位置设置dump
    set_dump_path("./cpu_resnet50_op.pkl")
    output = model_cpu(inputs)
    loss = criterion(output, labels)
    loss.backward()

    with opdiff.testing.inject_fault(**PLANTED) as fault:
        # 在npu上计算，在计算输出位置设置dump
        set_dump_path("./npu_resnet50_op.pkl")
        output = model_npu(inputs)
        loss = criterion(output, labels)
        loss.backward()
    assert fault.hits == 1

    # 对比dump出的数据精度，生成csv文件
    return compare("./npu_resnet50_op.pkl", "./cpu_resnet50_op.pkl", "./resnet50_result.csv")


@pytest.fixture(scope="module")
def seed003_files(tmp_path_factory):
    """Run the seed's script once; tests work on copies of what it wrote."""
    where = tmp_path_factory.mktemp("seed003")
    before = os.getcwd()
    os.chdir(where)
    try:
        result = seed003_script()
    finally:
        os.chdir(before)
    return where, result


@pytest.fixture
def seed003_copy(seed003_files, workdir):
    where, result = seed003_files
    shutil.copytree(where, workdir, dirs_exist_ok=True, symlinks=True)
    return result


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _first_bad(rows, rmse=1e-6):
    return next(r for r in rows if float(r["RMSE"]) > rmse)


def test_seed003_quick_start_names_the_planted_op(seed003_copy):
    result = seed003_copy
    assert result.first_divergence.name == CULPRIT

    rows = _csv("./resnet50_result.csv")
    assert list(rows[0]) == COLUMNS
    assert _first_bad(rows)["Name"].startswith(CULPRIT + ".output")
    first = rows[0]
    assert first["Npu Tensor Dtype"] == "torch.float32" and json.loads(first["Npu Tensor Shape"]) == [1, 3, 24, 24]

    # The seed's own snippet for reading the .pkl.
    pkl_file = open("./cpu_resnet50_op.pkl", 'r')
    tensor_line = pkl_file.readline()  # 读取行数据
    tensor_data = json.loads(tensor_line)
    pkl_file.close()
    name, data, dtype, shape = tensor_data     # 算子名称, 对应数据, 数据类型, 数据尺寸
    assert name == "Functional.conv2d.0.forward.input.0"
    assert dtype == "torch.float32" and shape == [1, 3, 24, 24]
    torch.manual_seed(1234)                    # seed_all() drew the inputs from this seed
    assert torch.allclose(torch.tensor(data).reshape(shape), torch.randn(1, 3, 24, 24))

    # Backward is recorded too (the seed's hooks cover forward and backward).
    names = [json.loads(line)[0] for line in open("./npu_resnet50_op.pkl")]
    assert any(".backward." in n for n in names) and any(n.startswith("Module.layer1.") for n in names)


def test_compare_reads_pkl_files_without_their_opdiff_dumps(seed003_copy):
    """Files from the real torch_npu.hooks have no .opdiff folder: compare reads the .pkl itself."""
    shutil.rmtree("./npu_resnet50_op.opdiff")
    shutil.rmtree("./cpu_resnet50_op.opdiff")
    result = compare("./npu_resnet50_op.pkl", "./cpu_resnet50_op.pkl", "./from_pkl.csv", shape_flag=True)
    assert result.first_divergence.name == CULPRIT
    rows = _csv("./from_pkl.csv")
    assert _first_bad(rows)["Name"].startswith(CULPRIT + ".output")
    assert all(r["Npu Tensor Shape"] == r["Bench Tensor Shape"] for r in rows)   # shape_flag=True


def test_an_existing_pkl_is_never_appended_to(workdir):
    (workdir / "cpu_module_op.pkl").write_text("keep me\n")
    with pytest.raises(ConfigError, match="already exists"):
        set_dump_path("./cpu_module_op.pkl")
    assert (workdir / "cpu_module_op.pkl").read_text() == "keep me\n"


def test_compare_does_not_overwrite_an_unrelated_csv(seed003_copy, workdir):
    (workdir / "notes.csv").write_text("my,own\n1,2\n")
    with pytest.raises(ConfigError, match="not an earlier compare result"):
        compare("./npu_resnet50_op.pkl", "./cpu_resnet50_op.pkl", "./notes.csv")
    assert (workdir / "notes.csv").read_text() == "my,own\n1,2\n"
    # its own earlier result is replaced
    compare("./npu_resnet50_op.pkl", "./cpu_resnet50_op.pkl", "./resnet50_result.csv")


def test_register_before_set_dump_path_and_same_path_twice(workdir, caplog):
    """The seed's step-by-step usage: hooks first, then a path; setting a path again appends."""
    from opdiff.compat import torch_npu_hooks
    torch_npu_hooks._recorder.path = None    # as in a fresh process: no path set yet
    torch.manual_seed(0)
    module = ResNet2d()
    register_acc_cmp_hook(module)
    module(torch.randn(1, 3, 8, 8))          # before any path: warned once, nothing recorded
    assert any("before set_dump_path" in m for m in caplog.messages)
    images = torch.randn(1, 3, 8, 8)
    set_dump_path("./cpu_module_op.pkl")
    module(images).sum().backward()
    set_dump_path("./other.pkl")
    set_dump_path("./cpu_module_op.pkl")     # the same file again: its recordings are appended
    module(images).sum().backward()
    set_dump_path("./third.pkl")             # ends the recording: the .pkl is rewritten whole
    lines = [json.loads(line)[0] for line in open("./cpu_module_op.pkl")]
    assert lines.count("Functional.conv2d.0.forward.input.0") == 2
    assert not (workdir / "other.pkl").exists()          # nothing ran while it was set
