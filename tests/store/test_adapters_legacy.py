"""discover() opens ptdbg_ascend and torch_npu.hooks `.pkl` dumps (JSON lines) as opdiff records.

Fixtures: tests/data/msprobe/legacy/, re-created formats (see tests/data/README.md); values
are checked against the lines of those files.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from opdiff.errors import DumpError
from opdiff.store import decoded_stats, iter_tensors
from opdiff.store.adapters import discover
from opdiff.store.adapters.legacy_calls import parse_hooks_name, parse_ptdbg_name

LEGACY = Path(__file__).resolve().parents[1] / "data" / "msprobe" / "legacy"
PTDBG_PKL = LEGACY / "ptdbg_v4/ptdbg_dump_v4.0/step0/rank0/api_stack_dump.pkl"
HOOKS_PKL = LEGACY / "npu_hooks/cpu_module_op.pkl"


def _lines(pkl: Path) -> dict:
    out = {}
    for raw in pkl.read_text().splitlines():
        item = json.loads(raw)
        out.setdefault(item[0], []).append(item)
    return out


# -- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,op,kind,phase,counter,role,path", [
    ("Functional_conv2d_0_forward_input.0", "Functional.conv2d", "api", "forward", 0, "input", ("0",)),
    ("Tensor___iadd___3_forward_output", "Tensor.__iadd__", "api", "forward", 3, "output", ()),
    ("VF_lstm_99_forward_input.1.0", "VF.lstm", "api", "forward", 99, "input", ("1", "0")),
    ("Functional_batch_norm_2_backward_output.2", "Functional.batch_norm", "api", "backward", 2,
     "output", ("2",)),
    ("Tensor___iadd___0_pre_forward_input.1", "Tensor.__iadd__", "api", "forward", 0, "input", ("1",)),
    ("Aten_add_1_forward_input.0", "Aten.add", "aten", "forward", 1, "input", ("0",)),
    ("Functional_conv2d_0_forward_stack_info", "Functional.conv2d", "api", "forward", 0,
     "stack_info", ()),
    ("mymodule_0_forward_input.0", "Module.mymodule", "module", "forward", 0, "input", ("0",)),
    ("Tensor___iadd___forward_input.0", "Tensor.__iadd__", "api", "forward", None, "input", ("0",)),
    ("Tensor___iadd___forward_stack_info", "Tensor.__iadd__", "api", "forward", None, "stack_info", ()),
])
def test_ptdbg_names_map_to_dotted_names(raw, op, kind, phase, counter, role, path):
    tn = parse_ptdbg_name(raw)
    assert (tn.op, tn.kind, tn.phase, tn.counter, tn.role, tn.path) == (op, kind, phase, counter, role, path)


@pytest.mark.parametrize("raw,op,kind,phase,counter,role", [
    ("Module_Conv2d_forward_input.0", "Module.Conv2d", "module", "forward", None, "input"),
    ("forward_BatchNorm2d_output", "Module.BatchNorm2d", "module", "forward", None, "output"),
    ("backward_Conv2d_input.0", "Module.Conv2d", "module", "backward", None, "input"),
    ("Functional_conv2d_forward_input.0", "Functional.conv2d", "api", "forward", None, "input"),
    ("Functional_conv2d_4_forward_input.0", "Functional.conv2d", "api", "forward", 4, "input"),
    ("Functional.conv2d.4.forward.input.0", "Functional.conv2d", "api", "forward", 4, "input"),
    ("Module.fc.Linear.backward.1.output.0", "Module.fc.Linear", "module", "backward", 1, "output"),
])
def test_torch_npu_hooks_names(raw, op, kind, phase, counter, role):
    tn = parse_hooks_name(raw)
    assert (tn.op, tn.kind, tn.phase, tn.counter, tn.role) == (op, kind, phase, counter, role)


def test_unrecognised_names_are_none():
    assert parse_ptdbg_name("hello") is None
    assert parse_hooks_name("no_phase_here") is None


# -- ptdbg_ascend -----------------------------------------------------------------------------

def test_ptdbg_v4_dump_records_statistics_and_tensors():
    (dump,) = discover(LEGACY / "ptdbg_v4")
    assert dump.format == "ptdbg_ascend" and (dump.step, dump.rank) == (0, 0)
    assert dump.tensor_keys() and dump.holds_tensors is False   # bf16 was saved as fp32
    count = dump.record_count()
    records = list(dump.records())
    assert count == len(records)
    assert [r["name"] for r in records] == [
        "Functional.conv2d.0.forward", "Functional.relu.0.forward", "Functional.conv2d.1.forward",
        "Tensor.__iadd__.0.forward", "Tensor.to.0.forward", "Functional.relu.1.forward",
        "Tensor.sum.0.forward", "Tensor.sum.0.backward", "Functional.relu.1.backward",
        "Tensor.to.0.backward", "Tensor.__iadd__.0.backward", "Functional.conv2d.1.backward",
        "Functional.relu.0.backward", "Functional.conv2d.0.backward"]
    lines = _lines(PTDBG_PKL)
    by_name = {r["name"]: r for r in records}
    conv = by_name["Functional.conv2d.0.forward"]
    (line,) = lines["Functional_conv2d_0_forward_input.1"]
    w = conv["inputs"][1]
    assert (w["dtype"], w["shape"]) == ("float32", line[4])
    stats = decoded_stats(w)
    assert [stats["max"], stats["min"], stats["mean"], stats["norm"]] == line[5]
    assert conv["inputs"][3] == {"type": "int", "value": 1}           # stride, a scalar line
    assert conv["outputs"][0]["key"] == "Functional_conv2d_0_forward_output"  # no index: one output
    back = by_name["Functional.conv2d.0.backward"]
    assert back["forward"] == "Functional.conv2d.0.forward"
    assert back["outputs"][0] == {"type": "none"}                   # no grad for the input image
    assert back["outputs"][1]["shape"] == [2, 2, 3, 3]

    for record in records:
        for _, _, desc in iter_tensors(record):
            t = dump.tensor(desc["key"])
            raw = np.load(PTDBG_PKL.with_suffix("") / f"{desc['key']}.npy")
            assert torch.equal(t, torch.from_numpy(raw))
            if t.numel():
                assert float(t.max()) == pytest.approx(decoded_stats(desc)["max"], rel=1e-6)


def test_ptdbg_bf16_tensors_come_back_as_fp32_with_bf16_descriptors():
    (dump,) = discover(PTDBG_PKL)
    relu = next(r for r in dump.records() if r["name"] == "Functional.relu.1.forward")
    desc = relu["outputs"][0]
    assert desc["dtype"] == "bfloat16"
    t = dump.tensor(desc["key"])
    assert t.dtype == torch.float32
    assert torch.equal(t, t.to(torch.bfloat16).float())              # exactly bf16 values


def test_ptdbg_stacks_and_backward_borrowing():
    (dump,) = discover(LEGACY / "ptdbg_v4")
    records = {r["name"]: r for r in dump.records()}
    frames = dump.stack(records["Tensor.__iadd__.0.forward"]["stack"])
    assert frames[0]["function"] == "make_ptdbg"
    assert frames[0]["code"].startswith('out = w.call("Tensor", "__iadd__"')
    assert isinstance(frames[0]["line"], int) and frames[0]["line"] > 0
    assert records["Tensor.__iadd__.0.backward"]["stack"] == records["Tensor.__iadd__.0.forward"]["stack"]
    assert records["Functional.conv2d.0.forward"]["stack"] != records["Functional.conv2d.1.forward"]["stack"]


def test_seed_000_layout_without_step_directory(tmp_path):
    rank = tmp_path / "npu" / "rank0"
    rank.mkdir(parents=True)
    (rank / "dump.pkl").write_bytes(PTDBG_PKL.read_bytes())
    (dump,) = discover(tmp_path / "npu")
    assert (dump.step, dump.rank) == (None, 0)
    assert dump.tensor_keys() == []                                # no dump/ directory here
    first = next(dump.records())
    assert "key" not in first["inputs"][0] and dump.tensor("anything") is None


def test_ptdbg_three_statistics_without_norm(tmp_path):
    # ptdbg before 4.0 wrote [max, min, mean] only.
    pkl = tmp_path / "step1" / "rank3" / "dump.pkl"
    pkl.parent.mkdir(parents=True)
    pkl.write_text(json.dumps(["Torch_matmul_0_forward_output", 1, [], "torch.float16", [2, 2],
                               [1.5, -0.5, 0.25]]) + "\n")
    (dump,) = discover(tmp_path)
    assert (dump.step, dump.rank) == (1, 3)
    (rec,) = dump.records()
    stats = decoded_stats(rec["outputs"][0])
    assert (stats["max"], stats["min"], stats["mean"], stats["norm"]) == (1.5, -0.5, 0.25, None)
    assert rec["outputs"][0]["dtype"] == "float16"


# -- torch_npu.hooks --------------------------------------------------------------------------

def test_torch_npu_hooks_calls_get_counters_and_backward_pairs():
    (dump,) = discover(LEGACY / "npu_hooks")
    assert dump.format == "torch_npu_hooks" and (dump.step, dump.rank) == (None, None)
    count = dump.record_count()
    records = list(dump.records())
    assert count == len(records) and dump.holds_tensors is False
    assert [r["name"] for r in records] == [
        "Module.Conv2d.forward.0", "Module.ReLU.forward.0", "Module.Conv2d.forward.1",
        "Module.ReLU.forward.1", "Module.Flatten.forward.0", "Module.Linear.forward.0",
        "Module.Linear.backward.0", "Module.Flatten.backward.0", "Module.ReLU.backward.1",
        "Module.Conv2d.backward.1", "Module.ReLU.backward.0", "Module.Conv2d.backward.0"]
    by_name = {r["name"]: r for r in records}
    assert by_name["Module.Conv2d.backward.1"]["forward"] == "Module.Conv2d.forward.1"
    # torch_npu's backward "input" is grad_input (w.r.t. the forward inputs): it becomes outputs.
    lin = by_name["Module.Linear.backward.0"]
    assert lin["inputs"][0]["shape"] == [1, 3] and lin["outputs"][0]["shape"] == [1, 8]
    # Data flows: the second conv's input is the first ReLU's output.
    relu_out = dump.tensor(by_name["Module.ReLU.forward.0"]["outputs"][0]["key"])
    conv_in = dump.tensor(by_name["Module.Conv2d.forward.1"]["inputs"][0]["key"])
    assert torch.equal(relu_out, conv_in) and relu_out.min() >= 0


def test_torch_npu_hooks_tensors_and_statistics_come_from_inline_values():
    (dump,) = discover(HOOKS_PKL)
    lines = _lines(HOOKS_PKL)
    record = next(r for r in dump.records() if r["name"] == "Module.Linear.forward.0")
    desc = record["outputs"][0]
    (line,) = lines["Module_Linear_forward_output"]
    values = np.array(line[1], dtype=np.float64)
    stats = decoded_stats(desc)
    assert stats["max"] == values.max() and stats["min"] == values.min()
    assert stats["mean"] == pytest.approx(values.mean()) and stats["norm"] == pytest.approx(np.linalg.norm(values))
    assert stats["nan"] == 0 and stats["inf"] == 0
    t = dump.tensor(desc["key"])
    assert list(t.shape) == line[3] and t.flatten().tolist() == pytest.approx(line[1], abs=0)
    assert set(dump.tensor_keys()) >= {desc["key"]}


def test_torch_npu_hooks_dtype_nonfinite_and_dotted_names(tmp_path):
    pkl = tmp_path / "npu_module_op.pkl"
    half = torch.tensor([1.0, float("nan"), float("inf"), 0.333], dtype=torch.float16)
    lines = [
        ["Functional.gelu.0.forward.input.0", half.float().tolist(), "torch.float16", [4]],
        ["Functional.gelu.0.forward.output.0", [0.5, 0.25, 1.0, 2.0], "torch.float32", [2, 2]],
        ["Functional.gelu.0.backward.input.0", [1.0, 1.0, 1.0, 1.0], "torch.float32", [2, 2]],
    ]
    pkl.write_text("".join(json.dumps(x) + "\n" for x in lines))     # Python writes bare NaN
    assert "NaN" in pkl.read_text()
    (dump,) = discover(pkl)
    fwd, bwd = list(dump.records())
    assert fwd["name"] == "Functional.gelu.0.forward" and bwd["name"] == "Functional.gelu.0.backward"
    assert bwd["inputs"][0]["shape"] == [2, 2]                       # dotted names: not swapped
    desc = fwd["inputs"][0]
    stats = decoded_stats(desc)
    assert stats["nan"] == 1 and stats["inf"] == 1 and math.isnan(stats["max"])
    t = dump.tensor(desc["key"])
    assert t.dtype == torch.float16
    assert torch.equal(torch.isnan(t), torch.isnan(half)) and t[3] == half[3]


def test_legacy_bad_input(tmp_path, caplog):
    empty = tmp_path / "empty.pkl"
    empty.write_text("\n")
    with pytest.raises(DumpError, match="empty file"):
        discover(empty)
    odd = tmp_path / "odd.pkl"
    odd.write_text('{"a": 1}\n')
    with pytest.raises(DumpError, match="unknown .pkl layout"):
        discover(odd)
    text = tmp_path / "text.pkl"
    text.write_text("hello world\n")
    with pytest.raises(DumpError, match="not JSON"):
        discover(text)

    good = PTDBG_PKL.read_text().splitlines()
    cut = tmp_path / "cut" / "dump.pkl"
    cut.parent.mkdir()
    cut.write_text("\n".join(good[:5]) + "\n" + good[5][: len(good[5]) // 2])
    (dump,) = discover(cut)
    with caplog.at_level(logging.WARNING, logger="opdiff"):
        records = list(dump.records())
    assert [r["name"] for r in records] == ["Functional.conv2d.0.forward"]
    assert "truncated" in caplog.text

    broken = tmp_path / "broken" / "dump.pkl"
    broken.parent.mkdir()
    broken.write_text("\n".join([good[0], good[1][:20], *good[2:]]) + "\n")
    (dump,) = discover(broken)
    with pytest.raises(DumpError) as e:
        list(dump.records())
    assert "line 2" in str(e.value) and "\n" not in str(e.value)


def test_stacks_and_tensors_are_available_before_records_are_read():
    (dump,) = discover(PTDBG_PKL)
    assert dump.stack(0)[0]["function"] == "make_ptdbg"
    (hooks,) = discover(HOOKS_PKL)
    t = hooks.tensor("Module.Linear.forward.0.output.0")
    assert list(t.shape) == [1, 3]


def test_dotted_names_round_trip_through_iter_tensors(tmp_path):
    # A .pkl written with msprobe names (opdiff's compat writer does this) keeps every name.
    names = ["Functional.relu.0.forward.input.0", "Functional.relu.0.forward.input.inplace",
             "Functional.relu.0.forward.output.0", "Module.fc.Linear.forward.0.input.0",
             "Module.fc.Linear.forward.0.output.0", "Module.fc.Linear.forward.0.parameters.weight",
             "Module.fc.Linear.parameters_grad.0.weight"]
    pkl = tmp_path / "compat.pkl"
    pkl.write_text("".join(json.dumps([n, [float(i), 2.0], "torch.float32", [2]]) + "\n"
                           for i, n in enumerate(names)))
    (dump,) = discover(pkl)
    records = list(dump.records())
    assert [r["name"] for r in records] == ["Functional.relu.0.forward", "Module.fc.Linear.forward.0",
                                            "Module.fc.Linear.parameters_grad.0"]
    assert [r["kind"] for r in records] == ["api", "module", "param_grad"]
    got = [n for r in records for n, _, _ in iter_tensors(r)]
    assert got == names
    for r in records:
        for n, _, desc in iter_tensors(r):
            assert dump.tensor(desc["key"]).tolist() == [float(names.index(n)), 2.0]


def test_ptdbg_lines_without_counters_get_them_in_order(tmp_path):
    pkl = tmp_path / "dump.pkl"
    lines = []
    for value in (1.0, 2.0):
        lines += [["Tensor___iadd___forward_input.0", 1, [], "torch.float32", [2], [value, value, value, value]],
                  ["Tensor___iadd___forward_output", 1, [], "torch.float32", [2], [value + 1] * 4],
                  ["Tensor___iadd___forward_stack_info", [["/u/model.py", "7", "forward", "out += residual"]]]]
    pkl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (dump,) = discover(pkl)
    first, second = dump.records()
    assert (first["name"], second["name"]) == ("Tensor.__iadd__.0.forward", "Tensor.__iadd__.1.forward")
    assert decoded_stats(second["inputs"][0])["max"] == 2.0
    assert dump.stack(second["stack"])[0]["code"] == "out += residual"
