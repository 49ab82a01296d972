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


def _dump_with_environment(root, environment):
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    (rank / "records.jsonl").write_text("")
    meta = {"format_version": 1}
    if environment is not None:
        meta["environment"] = environment
    (rank / "meta.json").write_text(json.dumps(meta))
    return root


def test_env_diff_command_uses_the_same_diff(tmp_path, capsys):
    from opdiff.cli import main
    from opdiff.environment import fingerprint

    recorded = dict(fingerprint(), argv="train.py --dump ./elsewhere", torch="1.0.0+other")
    dump = _dump_with_environment(tmp_path / "d", recorded)
    assert main(["env", "--diff", str(dump), "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)
    assert changes == [{"key": "torch", "target": torch.__version__, "golden": "1.0.0+other"}]
    assert main(["env", "--diff", str(dump)]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "argv" not in out


def test_env_diff_of_a_dump_without_fingerprint_is_bad_input(tmp_path, capsys):
    from opdiff.cli import main

    assert main(["env", "--diff", str(_dump_with_environment(tmp_path / "d", None))]) == 2
    assert "records no environment fingerprint" in capsys.readouterr().err
