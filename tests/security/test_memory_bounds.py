"""A dump cannot make opdiff allocate more than its files hold or `--max-tensor-mb` allows: a
stride-0 reference over a small base, a statistics record claiming a huge shape, a replayed op
asking for a huge result. Each is refused with one line ("tensor X needs N MB, over
--max-tensor-mb M: ...") and the command goes on (statistics fallback, "not checked" row).

The CLI runs in a subprocess under an address-space limit (RLIMIT_AS), so a regression fails
here instead of eating the machine."""
from __future__ import annotations

import csv
import json
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opdiff

SRC = str(Path(opdiff.__file__).resolve().parents[1])
CLI = "import sys; from opdiff.cli import main; sys.exit(main(sys.argv[1:]))"
ADDRESS_SPACE = 6 << 30      # the CLI with torch loaded needs about 1.5 GiB of it


def _opdiff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OPDIFF_MAX_TENSOR_MB", None)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=limit)


def _dump(path: Path, task: str = "tensor") -> Path:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with opdiff.dump(model, path, level="mix", task=task):
        torch.relu(model(torch.randn(2, 4))).sum().backward()
    return path / "step0" / "rank0"


def _add_reference(dump: Path, key: str, info: dict) -> None:
    """Store `key` as a reference (`ref:`) in the dump's shard, as a hostile writer would."""
    (shard,) = (dump / "tensors").glob("*.safetensors")
    raw = shard.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + length]), raw[8 + length:]
    header.setdefault("__metadata__", {})[f"ref:{key}"] = json.dumps(info)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    shard.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_a_stride_zero_reference_is_compared_by_its_statistics(tmp_path):
    target, golden = _dump(tmp_path / "t"), _dump(tmp_path / "g")
    # 3e9 float32 elements (12 GB) repeating the 48 bytes of the weight
    _add_reference(target, "Functional.linear.0.forward.output.0",
                   {"base": "Functional.linear.0.forward.input.1", "offset": 0,
                    "shape": [3 * 10**9], "stride": [0]})
    proc = _opdiff("compare", str(target), str(golden), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-3000:]
    assert ("tensor Functional.linear.0.forward.output.0 needs 11445 MB, over --max-tensor-mb "
            "4096: a reference repeating 48 stored bytes") in proc.stderr, proc.stderr[-3000:]
    assert "using its statistics" in proc.stderr
    assert (tmp_path / "out" / "summary.json").is_file()


def test_the_limit_is_the_users_to_set(tmp_path):
    """A 40 MB stride-0 view: read under the default limit, refused under --max-tensor-mb 8."""
    target, golden = _dump(tmp_path / "t"), _dump(tmp_path / "g")
    _add_reference(target, "Functional.linear.0.forward.output.0",
                   {"base": "Functional.linear.0.forward.input.1", "offset": 0,
                    "shape": [10**7], "stride": [0]})
    proc = _opdiff("compare", str(target), str(golden), "-o", str(tmp_path / "a"), cwd=tmp_path)
    assert proc.returncode in (0, 1) and "max-tensor-mb" not in proc.stderr, proc.stderr[-3000:]
    proc = _opdiff("compare", str(target), str(golden), "-o", str(tmp_path / "b"),
                   "--max-tensor-mb", "8", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "needs 39 MB, over --max-tensor-mb 8" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_a_bad_limit_is_one_line_and_exit_2(tmp_path, value):
    proc = _opdiff("compare", str(tmp_path), str(tmp_path), "--max-tensor-mb", value, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--max-tensor-mb expects a whole number" in proc.stderr


def test_check_device_does_not_make_a_huge_claimed_shape(tmp_path):
    dump = _dump(tmp_path / "s", task="statistics")
    lines = (dump / "records.jsonl").read_text().splitlines()
    with open(dump / "records.jsonl", "w") as f:
        for line in lines:
            rec = json.loads(line)
            if rec["name"] == "Torch.relu.0.forward":   # 3e8 elements: 4.8 GB to make up
                rec["inputs"][0]["shape"] = [3 * 10**8]
                rec["outputs"][0]["shape"] = [3 * 10**8]
            f.write(json.dumps(rec) + "\n")
    out = tmp_path / "out"
    proc = _opdiff("check", str(dump), "--device", "cpu", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    (table,) = out.glob("check_result_*.csv")
    rows = {r["name"]: r for r in csv.DictReader(table.open())}
    relu = rows["Torch.relu.0.forward"]
    assert relu["status"] == "not_checked"
    assert "needs 4578 MB, over --max-tensor-mb 4096" in relu["reason"], relu
    assert rows["Functional.linear.0.forward"]["status"] == "pass"


def test_a_replayed_call_asking_for_a_huge_result_is_refused(monkeypatch):
    from opdiff.comparison.replay.calls import NotReplayable, rebuild_call
    from opdiff.store.schema import complete

    monkeypatch.setenv("OPDIFF_MAX_TENSOR_MB", "16")
    size = {"type": "list", "items": [{"type": "int", "value": 10**6}] * 2}
    with pytest.raises(NotReplayable, match=r"needs 7629395 MB, over --max-tensor-mb 16"):
        rebuild_call(complete({"name": "Torch.zeros.0.forward", "op": "Torch.zeros", "inputs": [size]}),
                     {}.get)
    with pytest.raises(NotReplayable, match=r"needs 76294 MB, over --max-tensor-mb 16"):
        rebuild_call(complete({"name": "Torch.arange.0.forward", "op": "Torch.arange",
                               "inputs": [{"type": "int", "value": 10**10}]}), {}.get)
    idx = {"type": "tensor", "dtype": "int64", "shape": [4096], "key": "i"}
    with pytest.raises(NotReplayable, match=r"needs 128 MB, over --max-tensor-mb 16"):
        rebuild_call(complete({"name": "Functional.one_hot.0.forward", "op": "Functional.one_hot",
                               "inputs": [idx, {"type": "int", "value": 4096}]}),
                     {"i": torch.zeros(4096, dtype=torch.long)}.get)
    # an elementwise op of a [4096, 1] and a [1, 4096] tensor: a [4096, 4096] result
    col = {"type": "tensor", "dtype": "float32", "shape": [4096, 1], "key": "c"}
    row = {"type": "tensor", "dtype": "float32", "shape": [1, 4096], "key": "r"}
    rec = complete({"name": "Tensor.__add__.0.forward", "op": "Tensor.__add__", "inputs": [col, row]})
    saved = {"c": torch.ones(4096, 1), "r": torch.ones(1, 4096)}
    with pytest.raises(NotReplayable, match=r"needs 128 MB, over --max-tensor-mb 16"):
        rebuild_call(rec, saved.get)
    monkeypatch.setenv("OPDIFF_MAX_TENSOR_MB", "200")
    assert rebuild_call(rec, saved.get).run().shape == (4096, 4096)


def test_a_reference_outside_its_base_or_with_a_negative_size_is_not_read(tmp_path):
    from opdiff.store.reader import open_dump

    dump = _dump(tmp_path / "t")
    base = "Functional.linear.0.forward.input.1"         # 12 elements
    _add_reference(dump, "hostile.outside", {"base": base, "offset": 0, "shape": [2, 7],
                                              "stride": [7, 1]})
    _add_reference(dump, "hostile.negative", {"base": base, "offset": 0, "shape": [-4, 3],
                                              "stride": [3, 1]})
    _add_reference(dump, "hostile.inside", {"base": base, "offset": 0, "shape": [4, 3],
                                            "stride": [3, 1]})
    opened = open_dump(dump)
    assert opened.tensor("hostile.outside") is None
    assert opened.tensor("hostile.negative") is None
    assert opened.tensor("hostile.inside").shape == (4, 3)
