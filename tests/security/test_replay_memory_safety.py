"""A hostile dump must never corrupt opdiff's memory: replay refuses, before the kernel sees
them, the arguments of allow-listed ops whose CPU kernels trust them (a view past its storage,
index tensors out of range, missing statistics, integers cast to enums, integer division by
zero on plain numbers), and bounds every result by --max-tensor-mb before it is made. Hostile
kernel programs and plain L2 records are added to a real small dump, and the real CLI runs in a
child process: before the fix it died by SIGSEGV/SIGFPE (rc -11/-8/139) with nothing printed."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opdiff

from pickle_payload import CLI, SRC

BIG = 1 << 40


def _in(i: int) -> dict:
    return {"ref": "input", "index": i}


def _step(i: int) -> dict:
    return {"ref": "step", "index": i}


def _ints(*v: int) -> dict:
    return {"type": "list", "items": [{"type": "int", "value": x} for x in v]}


def _i(v: int) -> dict:
    return {"type": "int", "value": v}


def _full(shape: list[int], value: float, dtype: str = "torch.float32") -> dict:
    return {"op": "Aten.full", "args": [_ints(*shape), {"type": "float", "value": value}
                                        if dtype == "torch.float32" else _i(int(value))],
            "kwargs": {"dtype": {"type": "dtype", "value": dtype}}}


def _programs() -> dict[str, dict]:
    """Kernel programs that reached memory outside their tensors through allow-listed ops."""
    one = lambda step: [{"output": 0, "value": _step(step)}]    # noqa: E731
    return {
        "reshape_alias": {"steps": [
            {"op": "Aten._reshape_alias", "args": [_in(0), _ints(2, 3), _ints(BIG, 1)]},
            {"op": "Aten.mul", "args": [_step(0), {"type": "float", "value": 1.5}]}],
            "outputs": one(1)},
        "max_pool_backward": {"steps": [
            _full([1, 1, 1, 1], 1.0), _full([1, 1, 4, 4], 0.0),
            _full([1, 1, 1, 1], BIG, "torch.int64"),
            {"op": "Aten.max_pool2d_with_indices_backward", "args": [
                _step(0), _step(1), _ints(4, 4), _ints(4, 4), _ints(0, 0), _ints(1, 1),
                {"type": "bool", "value": False}, _step(2)]}], "outputs": one(3)},
        "embedding_backward": {"steps": [
            _full([2, 3], 1.0), _full([2], BIG, "torch.int64"),
            {"op": "Aten.embedding_dense_backward", "args": [_step(0), _step(1), _i(4), _i(-1),
                                                             {"type": "bool", "value": True}]}],
            "outputs": one(2)},
        "batch_norm_eval_without_statistics": {"steps": [
            {"op": "Aten.native_batch_norm", "args": [
                _in(0), {"type": "none"}, {"type": "none"}, {"type": "none"}, {"type": "none"},
                {"type": "bool", "value": False}, {"type": "float", "value": 0.1},
                {"type": "float", "value": 1e-5}]}], "outputs": one(0)},
        "memory_format_out_of_range": {"steps": [
            {"op": "Aten.clone", "args": [_in(0)], "kwargs": {"memory_format": _i(4)}}],
            "outputs": one(0)},
        "integer_division_by_zero": {"steps": [
            {"op": "Aten.remainder", "args": [_i(5), _i(0)]},
            {"op": "Aten.mul", "args": [_in(0), _step(0)]}], "outputs": one(1)},
        "pad_by_2_to_the_40": {"steps": [
            {"op": "Aten.constant_pad_nd", "args": [_in(0), _ints(0, BIG)]}], "outputs": one(0)},
        "legit": {"steps": [{"op": "Aten.sigmoid", "args": [_in(0)]},
                            {"op": "Aten.mul", "args": [_in(0), _step(0)]}], "outputs": one(1)},
    }


def _dump(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A real dump of a linear then silu, with one kernel record per program (a copy of the
    silu record, its saved input and output) and plain L2 records of the same hostile calls."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with opdiff.dump(model, tmp_path / "d", level="mix", task="tensor"):
        torch.nn.functional.silu(model(torch.randn(2, 4))).sum()
    dump = tmp_path / "d" / "step0" / "rank0"
    recs = [json.loads(line) for line in (dump / "records.jsonl").read_text().splitlines()]
    silu = next(r for r in recs if r["op"] == "Functional.silu")
    x = silu["inputs"][0]                # a saved [2, 3] float32 tensor
    seq = max(r.get("seq", 0) for r in recs)
    names = {}
    with open(dump / "records.jsonl", "a") as f:
        for i, (case, program) in enumerate(_programs().items()):
            seq += 1
            names[case] = name = f"Inductor.cpp_fused_silu_0.{i}.forward"
            f.write(json.dumps(dict(silu, name=name, op="Inductor.cpp_fused_silu_0",
                                    kind="kernel", seq=seq, program=program)) + "\n")
        # the same view, as a plain L2 record of the dump (no Inductor)
        seq += 1
        names["l2_reshape_alias"] = "Aten._reshape_alias.0.forward"
        f.write(json.dumps(dict(silu, name="Aten._reshape_alias.0.forward",
                                op="Aten._reshape_alias", kind="aten", seq=seq,
                                inputs=[x, {"type": "list", "items": [_i(2), _i(3)]},
                                        {"type": "list", "items": [_i(BIG), _i(1)]}],
                                kwargs={})) + "\n")
    return dump, names


def _opdiff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MALLOC_CHECK_="3")

    def limit() -> None:                # a regression fails here instead of eating the machine
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=limit)


def _alive(proc: subprocess.CompletedProcess) -> None:
    died = -proc.returncode if proc.returncode < 0 else proc.returncode - 128
    assert proc.returncode in (0, 1), (
        f"opdiff died (rc {proc.returncode}"
        f"{', ' + signal.Signals(died).name if 0 < died < 64 else ''}): "
        f"{(proc.stdout + proc.stderr)[-2000:]}")


def test_check_refuses_kernel_programs_and_records_that_reach_outside_their_tensors(tmp_path):
    dump, names = _dump(tmp_path)
    out = tmp_path / "check_out"
    proc = _opdiff("check", str(dump), "-o", str(out), "--max-tensor-mb", "64", cwd=tmp_path)
    _alive(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    reasons = {o["name"]: o["reason"] for o in summary["not_checked"]}
    expected = {
        "reshape_alias": "its sizes and strides reach past the tensor's storage",
        "l2_reshape_alias": "its sizes and strides reach past the tensor's storage",
        "max_pool_backward": "its indices hold values outside [0, 16)",
        "embedding_backward": "its indices hold values outside [0, 4)",
        "batch_norm_eval_without_statistics": "running statistics it was not given",
        "memory_format_out_of_range": "it passes 4 where the op takes a MemoryFormat",
        "integer_division_by_zero": "it computes on plain numbers only",
        "pad_by_2_to_the_40": "over --max-tensor-mb 64",
    }
    for case, why in expected.items():
        assert why in reasons.get(names[case], ""), (case, reasons.get(names[case]))
    assert names["legit"] not in reasons and summary["failed"] == 0, summary


def test_compare_with_replay_refuses_them_too(tmp_path):
    target, names = _dump(tmp_path / "t")
    golden, _ = _dump(tmp_path / "g")
    out = tmp_path / "compare_out"
    proc = _opdiff("compare", str(target), str(golden), "-o", str(out), "--replay", "all",
                   cwd=tmp_path)
    _alive(proc)
    assert (out / "summary.json").is_file()


def test_a_control_flow_op_or_a_modules_method_is_not_a_tensor_op():
    """The allow-list is by method name: `cond` (torch.linalg.cond) must not admit torch.cond,
    which calls the functions it is given, nor `__eq__` a module's own method."""
    from opdiff.comparison.replay.calls import NotReplayable, resolve

    for op in ("Torch.cond", "Torch.__eq__", "Functional.__ge__", "Torch.linalg.__lt__"):
        with pytest.raises(NotReplayable, match="untrusted"):
            resolve(op)
    assert resolve("Torch.linalg.cond") is torch.linalg.cond


def test_results_are_bounded_before_they_are_made(monkeypatch):
    """Each op's result is sized from its arguments before it runs: a fill value is not a
    size, and pad, embedding_dense_backward, bincount, outer, kron, cdist, cartesian_prod and
    interpolate are bounded by what they would make."""
    from opdiff.comparison.replay.calls import NotReplayable, rebuild_call

    monkeypatch.setenv("OPDIFF_MAX_TENSOR_MB", "16")
    t = lambda key: {"type": "tensor", "key": key}      # noqa: E731
    fl = lambda v: {"type": "float", "value": v}        # noqa: E731
    saved = {"v": torch.ones(2048), "x": torch.ones(2, 3), "ids": torch.tensor([3, 1]),
             "big": torch.tensor([BIG]), "m": torch.ones(2048, 3), "img": torch.ones(1, 1, 4, 4),
             "g": torch.ones(2, 3)}
    full = rebuild_call({"name": "Torch.full.0.forward", "op": "Torch.full",
                         "inputs": [_ints(4, 4), _i(10**9)], "kwargs": {}}, saved.get)
    assert full.run().shape == (4, 4)          # 10**9 is what it holds, not how many
    hostile = {
        "Functional.pad": ([t("x"), _ints(0, 10**7)], {}),
        "Aten.constant_pad_nd": ([t("x"), _ints(10**7, 0)], {}),
        "Aten.embedding_dense_backward": ([t("g"), t("ids"), _i(10**7), _i(-1),
                                           {"type": "bool", "value": False}], {}),
        "Torch.bincount": ([t("ids")], {"minlength": _i(10**8)}),
        "Torch.bincount.values": ([t("big")], {}),
        "Torch.outer": ([t("v"), t("v")], {}),
        "Torch.kron": ([t("v"), t("m")], {}),
        "Torch.cdist": ([t("m"), t("m")], {}),
        "Torch.cartesian_prod": ([t("v"), t("v")], {}),
        "Functional.interpolate": ([t("img")], {"scale_factor": fl(10000.0)}),
        "Torch.mvlgamma": ([t("x"), _i(1 << 33)], {}),
    }
    for op, (inputs, kwargs) in hostile.items():
        name = op.removesuffix(".values")
        rec = {"name": f"{name}.0.forward", "op": name, "inputs": inputs, "kwargs": kwargs}
        with pytest.raises(NotReplayable, match="over --max-tensor-mb 16|asks for"):
            rebuild_call(rec, saved.get)
            pytest.fail(f"{op} was not bounded")
