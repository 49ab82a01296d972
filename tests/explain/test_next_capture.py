"""Following the chain's next capture settles what a compare left open: a culprit named from
statistics only (probable) becomes a confirmed one after the tensor dump the chain asks for."""
from __future__ import annotations

import json

import pytest

from faultkit import compare, summary, train
from opdiff.cli import main
from opdiff.config import DumpConfig

FAULT = {"op": "Torch.tanh", "call": 0, "scale": 1.001}


def test_statistics_only_then_the_proposed_tensor_dump_confirms_the_culprit(tmp_path, capsys):
    train(tmp_path / "golden", task="statistics")
    train(tmp_path / "target", task="statistics", fault=FAULT)
    compare(tmp_path)
    chain = summary(tmp_path / "out")["evidence"]
    assert chain["culprit"]["name"] == "Torch.tanh.0.forward"
    assert chain["confidence"] == "probable"
    assert "statistics_only" in [f["type"] for f in chain["facts"]]
    nxt = chain["next"]
    assert nxt["action"] == "capture"
    config = tmp_path / "next.json"
    assert main(["explain", str(tmp_path / "out"), "--next-config", str(config)]) == 0
    loaded = DumpConfig.from_file(config)          # what PrecisionDebugger reads
    assert (loaded.task, loaded.level, loaded.step, loaded.rank) == ("tensor", "mix", [0], [0])
    assert loaded.scope == ["Module.3.Tanh.forward"] * 2
    assert json.loads(config.read_text()) == nxt["config"]
    # summary.json says OUT (a folder copied elsewhere stays right); explain spells it
    assert nxt["commands"][0] == "opdiff explain OUT --next-config OUT/next_capture.json"
    out = str(tmp_path / "out")
    capsys.readouterr()
    assert main(["explain", out, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["next"]["commands"]
    assert printed[0] == f"opdiff explain {out} --next-config {out}/next_capture.json"
    assert printed[1].startswith(f"opdiff run --config {out}/next_capture.json --dump ")
    assert printed[-2].endswith(f"-o {out}-next")

    again = tmp_path / "next"
    train(again / "golden", config=config)
    train(again / "target", config=config, fault=FAULT)
    result = compare(again)
    settled = summary(again / "out")["evidence"]
    assert result.first_divergence.name == settled["culprit"]["name"] == "Torch.tanh.0.forward"
    assert settled["confidence"] == "confirmed" and settled["next"]["action"] == "read_code"
    assert all(r.mode == "tensor" for r in result.rows)
    # writing the config again over a different file is refused, the file is kept
    config.write_text("{}")
    assert main(["explain", str(again / "out"), "--next-config", str(config)]) == 2
    assert config.read_text() == "{}"


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_a_module_named_at_L0_is_opened_at_mix_and_its_op_named(tmp_path, task):
    """At L0 the culprit is a module call (its ops are not recorded): the next capture records
    level mix inside that module (tensors), and the compare of that names the op in it."""
    train(tmp_path / "golden", task=task, level="L0")
    train(tmp_path / "target", task=task, level="L0", fault=FAULT)
    compare(tmp_path)
    chain = summary(tmp_path / "out")["evidence"]
    assert chain["culprit"]["name"] == "Module.3.Tanh.forward.0"
    assert chain["culprit"]["record_kind"] == "module"
    config = chain["next"]["config"]
    assert chain["next"]["action"] == "capture"
    assert (config["task"], config["level"]) == ("tensor", "mix")
    assert config["tensor"]["scope"] == ["Module.3.Tanh.forward"] * 2
    path = tmp_path / "next.json"
    assert main(["explain", str(tmp_path / "out"), "--next-config", str(path)]) == 0
    again = tmp_path / "next"
    train(again / "golden", config=path)
    train(again / "target", config=path, fault=FAULT)
    result = compare(again)
    settled = summary(again / "out")["evidence"]
    assert result.first_divergence.name == settled["culprit"]["name"] == "Torch.tanh.0.forward"
    assert settled["confidence"] == "confirmed" and settled["next"]["action"] == "read_code"


def test_an_inconclusive_statistics_compare_asks_for_tensors(tmp_path):
    """No culprit from statistics while a tensor differs beyond its floor: the chain says
    inconclusive, never agreement, and its capture records tensors of that step and rank."""
    from opdiff.comparison.result import CompareResult, TensorRow
    from opdiff.explain import evidence_of

    rows = [TensorRow("Torch.tanh.0.forward.output.0", "Torch.tanh.0.forward.output.0",
                      "Torch.tanh.0.forward", "output", "forward", "api", 3, "float32", "float32",
                      result="error", error=1e-3, mode="statistics", step=2, rank=1,
                      module="Module.3.Tanh.forward.0"),
            TensorRow("Module.3.Tanh.forward.0.output.0", "Module.3.Tanh.forward.0.output.0",
                      "Module.3.Tanh.forward.0", "output", "forward", "module", 4, "float32",
                      "float32", result="warning", error=1e-3, mode="statistics", step=2, rank=1)]
    result = CompareResult("t/step2/rank1", "g/step2/rank1", rows, None,
                           {"pass": 0, "warning": 1, "error": 1, "unmatched": 0}, step=2, rank=1)
    chain = evidence_of(result, output="out")
    assert (chain["verdict"], chain["confidence"]) == ("inconclusive", "none")
    first = next(f for f in chain["facts"] if f["type"] == "first_error_unblamed")
    assert first["op"] == "Torch.tanh.0.forward" and first["ratio"] == pytest.approx(100)
    config = chain["next"]["config"]
    assert chain["next"]["action"] == "capture"
    assert (config["task"], config["level"], config["step"], config["rank"]) == ("tensor", "mix", [2], [1])
    assert config["tensor"]["list"] == ["Torch.tanh.forward"]
    assert config["dump_path"] == "t-next"


def test_upstream_ops_are_cleared_with_their_reason():
    """The ops before the culprit whose outputs differ are listed, nearest last, each with why
    it was not named: within its floor, inherited from its inputs, or not blamed by the rules."""
    from opdiff.comparison.result import CompareResult, Divergence, TensorRow
    from opdiff.explain import evidence_of

    def rows(op, i, result, err_in, err_out, dtype="float32"):
        return [TensorRow(f"{op}.input.0", f"{op}.input.0", op, "input", "forward", "api", i, dtype,
                          dtype, result="pass", error=err_in, mode="tensor"),
                TensorRow(f"{op}.output.0", f"{op}.output.0", op, "output", "forward", "api", i,
                          dtype, dtype, result=result, error=err_out, mode="tensor", reason=f"{op} said")]

    fillers = [r for i in range(20) for r in rows(f"Torch.abs.{i}.forward", i, "warning", 1e-5, 2e-5)]
    data = fillers + rows("Torch.exp.0.forward", 20, "warning", 0.0, 8e-6) \
        + rows("Torch.mul.0.forward", 21, "warning", 1e-4, 5e-4) \
        + rows("Torch.sin.0.forward", 22, "error", 0.0, 1e-3, dtype="bfloat16") \
        + rows("Torch.cos.0.forward", 23, "error", 0.0, 1e-3) \
        + rows("Torch.tan.0.forward", 24, "error", 0.0, 1e-2)
    fd = Divergence("Torch.cos.0.forward", "Torch.cos", "forward", "inputs agree, output does not",
                    None, {}, step=None, rank=None)
    chain = evidence_of(CompareResult("t", "g", data, fd, {}))
    up = next(f for f in chain["facts"] if f["type"] == "upstream_cleared")
    assert up["count"] == 23 and len(up["ops"]) == 8
    why = {op["name"]: op["why"] for op in up["ops"]}
    assert why["Torch.exp.0.forward"] == "within_floor"
    assert why["Torch.mul.0.forward"] == "inherited"
    assert why["Torch.sin.0.forward"] == "within_floor"          # bf16's floor is 1.6e-2
    assert list(why)[-1] == "Torch.sin.0.forward" and "Torch.abs.0.forward" not in why
    assert next(f for f in chain["facts"] if f["type"] == "downstream")["errors"] == 1
    agree = next(f for f in chain["facts"] if f["type"] == "inputs_agree")
    assert agree["tensors"][0]["ratio"] == 0
    differs = next(f for f in chain["facts"] if f["type"] == "output_differs")
    assert differs["worst_ratio"] == pytest.approx(100)


def test_an_output_within_its_floor_named_by_its_scale_says_so():
    from opdiff.comparison.result import SCALE, CompareResult, Divergence, TensorRow
    from opdiff.explain import evidence_of

    op = "Torch.exp.0.forward"
    data = [TensorRow(f"{op}.input.0", f"{op}.input.0", op, "input", "forward", "api", 0, "float32",
                      "float32", error=0.0),
            TensorRow(f"{op}.output.0", f"{op}.output.0", op, "output", "forward", "api", 0,
                      "float32", "float32", result="error", error=5e-6, scale_error=4e-6)]
    fd = Divergence(op, "Torch.exp", "forward", "scaled", None, {}, kind=SCALE)
    differs = next(f for f in evidence_of(CompareResult("t", "g", data, fd, {}))["facts"]
                   if f["type"] == "output_differs")
    assert differs["worst_ratio"] == pytest.approx(0.5) and "systematic" in differs["says"]
