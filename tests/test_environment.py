"""The environment diff: one owner, used by `opdiff compare` and `opdiff env --diff` alike."""
from __future__ import annotations

import json
import sys

import torch

import opdiff
from opdiff.environment import diff, diff_meta


def test_argv_is_noise_and_nested_keys_are_dotted():
    t = {"argv": "train.py --dump ./npu", "torch": "2.13", "devices": ["A"]}
    g = {"argv": "train.py --dump ./gpu", "torch": "2.12", "devices": ["A"], "cudnn": 9}
    changes = {c["key"]: (c["target"], c["golden"]) for c in diff(t, g)}
    assert changes == {"torch": ("2.13", "2.12"), "cudnn": ("(absent)", 9)}
    assert diff_meta({"environment": {"x": {"y": 1}}}, {"environment": {"x": {"y": 2}}}) == [
        {"key": "x.y", "target": 1, "golden": 2}]


def test_a_real_compare_does_not_report_argv(tmp_path, monkeypatch):
    # Two dumps made by "different command lines": the paths always differ, numerics do not.
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    for side in ("t", "g"):
        monkeypatch.setattr(sys, "argv", ["train.py", "--dump", str(tmp_path / side)])
        with opdiff.dump(model, str(tmp_path / side), level="L1"):
            model(x).sum().backward()
    result = opdiff.compare(tmp_path / "t", tmp_path / "g", output_path=tmp_path / "out")
    assert [d["key"] for d in result.environment_diff] == []
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["environment_diff"] == []
