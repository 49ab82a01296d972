"""A dump is untrusted input: replay (`opdiff check`, and `opdiff compare`'s default `--replay
auto`) re-runs only pure tensor computations on the dump's own tensors. Records naming
torch.load, torch.save, torch.from_file, a string that is not a known enum, `out=` or an object
are refused ("not replayed" / "not checked" with the reason), and nothing is read, written or
unpickled. Each test takes a real small dump and appends hostile records to it, then runs the
real CLI in a subprocess."""
from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opdiff

from pickle_payload import CLI, SRC
from pickle_payload import Payload as _Payload


def _real_dump(path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with opdiff.dump(model, path, level="mix", task="tensor"):
        torch.relu(model(torch.randn(2, 4))).sum().backward()
    return path / "step0" / "rank0"


def _tensor(key: str, shape: list[int]) -> dict:
    return {"type": "tensor", "dtype": "float32", "shape": shape, "key": key}


def _hostile_records(dump: Path, files: dict[str, Path]) -> list[dict]:
    recs = [json.loads(line) for line in (dump / "records.jsonl").read_text().splitlines()]
    linear = next(r for r in recs if r["name"] == "Functional.linear.0.forward")
    x = linear["inputs"][0]                  # a saved [2, 4] float32 tensor
    out = linear["outputs"][0]               # a saved [2, 3] float32 tensor
    seq = max(r.get("seq", 0) for r in recs) + 1

    def rec(op: str, inputs: list, kwargs: dict | None = None, outputs: list | None = None) -> dict:
        nonlocal seq
        seq += 1
        return {"name": f"{op}.0.forward", "op": op, "kind": "api", "phase": "forward",
                "inputs": inputs, "kwargs": kwargs or {}, "outputs": outputs or [out], "seq": seq}

    s = lambda v: {"type": "str", "value": str(v)}    # noqa: E731
    return [
        rec("Torch.load", [s(files["payload"])], {"weights_only": {"type": "bool", "value": False}}),
        rec("Torch.save", [x, s(files["saved"])]),
        rec("Torch.from_file", [s(files["secret"])],
            {"shared": {"type": "bool", "value": False}, "size": {"type": "int", "value": 6}}),
        rec("Tensor.add", [x, s(files["secret"])]),              # a path where a number goes
        rec("Torch.add", [x, x], {"out": x}),                       # out= into a given tensor
        rec("Tensor.apply_", [x, {"type": "object", "value": "<function f at 0x7f>"}]),
    ]


@pytest.fixture()
def hostile(tmp_path):
    files = {"payload": tmp_path / "payload.pt", "marker": tmp_path / "PWNED",
             "saved": tmp_path / "written_by_replay.pt", "secret": tmp_path / "secret.txt"}
    with open(files["payload"], "wb") as f:
        pickle.dump(_Payload(str(files["marker"])), f)
    files["secret"].write_text("secret")
    dump = _real_dump(tmp_path / "t")
    extra = _hostile_records(dump, files)
    with open(dump / "records.jsonl", "a") as f:
        for r in extra:
            f.write(json.dumps(r) + "\n")
    golden = tmp_path / "g"
    shutil.copytree(tmp_path / "t", golden)
    return dump, golden / "step0" / "rank0", files, extra


def _opdiff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _untouched(files: dict[str, Path]) -> None:
    assert not files["marker"].exists(), "replay unpickled a payload (torch.load ran)"
    assert not files["saved"].exists(), "replay wrote a file (torch.save ran)"
    assert files["secret"].read_text() == "secret"


def test_check_refuses_hostile_ops_and_runs_nothing(hostile, tmp_path):
    dump, _golden, files, extra = hostile
    out = tmp_path / "check_out"
    proc = _opdiff("check", str(dump), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _untouched(files)
    summary = json.loads((out / "summary.json").read_text())
    reasons = {o["name"]: o["reason"] for o in summary["not_checked"]}
    for op in ("Torch.load", "Torch.save", "Torch.from_file", "Tensor.apply_"):
        assert "not an op replay trusts" in reasons[f"{op}.0.forward"], reasons
    assert "string argument" in reasons["Tensor.add.0.forward"], reasons
    assert "out=" in reasons["Torch.add.0.forward"], reasons
    assert len([r for r in extra if r["name"] in reasons]) == len(extra)
    # the real ops of the dump are still checked, and pass
    (table,) = out.glob("check_result_*.csv")
    rows = {r["name"]: r for r in csv.DictReader(table.open())}
    assert rows["Functional.linear.0.forward"]["status"] == "pass"
    assert "not an op replay trusts" in rows["Torch.load.0.forward"]["reason"]


def test_compare_with_default_replay_refuses_hostile_ops(hostile, tmp_path):
    target, golden, files, extra = hostile
    out = tmp_path / "compare_out"
    proc = _opdiff("compare", str(target), str(golden), "-o", str(out), "--replay", "all",
                   cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    _untouched(files)
    text = proc.stdout + (out / "summary.json").read_text()
    assert "refused as untrusted" in text, text[-3000:]
    for name in ("Torch.load.0.forward", "Torch.save.0.forward", "Torch.from_file.0.forward"):
        assert name in text


def test_compare_blaming_a_hostile_op_says_it_was_not_replayed(hostile, tmp_path):
    """The golden's hostile records get other outputs: the compare's default replay wants to
    judge them (the first divergence) and must refuse, saying so."""
    target, golden, files, extra = hostile
    recs = [json.loads(line) for line in (golden / "records.jsonl").read_text().splitlines()]
    relu = next(r for r in recs if r["name"] == "Torch.relu.0.forward")["outputs"][0]
    hostile_names = {r["name"] for r in extra}
    with open(golden / "records.jsonl", "w") as f:
        for r in recs:
            if r["name"] in hostile_names:
                r["outputs"] = [relu]
            f.write(json.dumps(r) + "\n")
    out = tmp_path / "o3"
    proc = _opdiff("compare", str(target), str(golden), "-o", str(out), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    _untouched(files)
    text = proc.stdout + (out / "summary.json").read_text()
    assert ("not replayed (e.g. Torch.load.0.forward: untrusted: Torch.load is not an op "
            "replay trusts") in text, text[-3000:]
    assert "refused as untrusted" in text


def test_compare_default_replay_runs_nothing(hostile, tmp_path):
    target, golden, files, _extra = hostile
    proc = _opdiff("compare", str(target), str(golden), "-o", str(tmp_path / "o2"), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    _untouched(files)


@pytest.mark.parametrize("op", ["Torch.load", "Torch.save", "Torch.from_file", "Torch.frombuffer",
                                "Tensor.apply_", "Tensor.map_", "Tensor.set_",
                                "Torch.set_default_dtype", "Torch.manual_seed", "Aten.add.out",
                                "Tensor.register_hook", "Tensor.__reduce_ex__"])
def test_only_pure_tensor_ops_are_trusted(op):
    from opdiff import ops
    from opdiff.comparison.replay.calls import NotReplayable, resolve

    assert ops.replay_refusal(op)
    with pytest.raises(NotReplayable):
        resolve(op)


def test_strings_pass_only_as_known_enums():
    from opdiff.comparison.replay.calls import NotReplayable, rebuild_call
    from opdiff.store.schema import complete

    x = torch.randn(3)
    rec = complete({"name": "Functional.gelu.0.forward", "op": "Functional.gelu",
                    "inputs": [_tensor("x", [3])], "kwargs": {"approximate": {"type": "str", "value": "tanh"}}})
    assert rebuild_call(rec, {"x": x}.get).kwargs["approximate"] == "tanh"
    rec["kwargs"]["approximate"] = {"type": "str", "value": "/etc/passwd"}
    with pytest.raises(NotReplayable, match="string argument"):
        rebuild_call(rec, {"x": x}.get)
    eq = complete({"name": "Torch.einsum.0.forward", "op": "Torch.einsum",
                   "inputs": [{"type": "str", "value": "ij,jk->ik"}, _tensor("a", [2, 2]), _tensor("a", [2, 2])]})
    assert rebuild_call(eq, {"a": torch.eye(2)}.get).args[0] == "ij,jk->ik"
    eq["inputs"][0] = {"type": "str", "value": "__import__('os')"}
    with pytest.raises(NotReplayable, match="string argument"):
        rebuild_call(eq, {"a": torch.eye(2)}.get)
