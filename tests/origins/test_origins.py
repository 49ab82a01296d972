"""The first divergence names its origin when it is not an op's kernel: a parameter, a buffer,
an input or a random generator. Golden and target are dumped in two processes (scenarios.py) and
compared through the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opdiff.cli import main

HERE = Path(__file__).parent
TASKS = ("tensor", "statistics")
# case -> (origin, tensor, the op that reads it first: a substring of its record name)
CASES = {
    "cnn-element": ("parameter", "conv2.weight", "Functional.conv2d.1.forward"),
    "cnn-layer": ("parameter", "conv2.weight", "Functional.conv2d.1.forward"),
    "cnn-seed": ("parameter", "conv1.weight", "Functional.conv2d.0.forward"),
    "cnn-buffer": ("buffer", "bn1.running_mean", "Functional.batch_norm.0.forward"),
    "cnn-input": ("input", "0", "Module.conv1.Conv2d.forward.0"),
    "block-element": ("parameter", "mlp.2.weight", "Functional.linear.1.forward"),
    "block-layer": ("parameter", "mlp.0.weight", "Functional.linear.0.forward"),
    "block-seed": ("parameter", "attn.in_proj_weight", "Functional.multi_head_attention_forward.0"),
    "block-input": ("input", "0", "Module.norm.LayerNorm.forward.0"),
    "block-random": ("random", None, "Functional.multi_head_attention_forward.0.forward"),
}
# the golden run a target case is compared with (the same family, mode and generator use)
GOLDEN = {case: case if case in ("cnn-buffer", "block-random") else case.split("-")[0]
          for case in CASES}


def _dump(side: str, root: Path, cases) -> None:
    subprocess.run([sys.executable, str(HERE / "scenarios.py"), side, str(root), ",".join(cases),
                    ",".join(TASKS)], check=True, timeout=600)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("origins")
    _dump("golden", root / "golden", sorted(set(GOLDEN.values())))
    _dump("target", root / "target", list(CASES))
    return root


def _compare(dumps: Path, task: str, case: str, out: Path) -> tuple[int, dict]:
    rc = main(["compare", str(dumps / "target" / task / case),
               str(dumps / "golden" / task / GOLDEN[case]), "-o", str(out), "--no-progress",
               "--fail-on-divergence"])
    return rc, json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("case", list(CASES))
def test_origin_named(dumps, tmp_path, case, task):
    origin, tensor, reader = CASES[case]
    rc, summary = _compare(dumps, task, case, tmp_path)
    fd = summary["first_divergence"]
    assert rc == 1                              # --fail-on-divergence: every origin fails
    assert fd["origin"] == origin, fd["reason"]
    assert reader in fd["name"]
    assert fd["step"] == 0 and fd["rank"] == 0
    if tensor is not None:
        assert fd["tensor"] == tensor
        assert fd["location"]["file"].endswith("scenarios.py")
    if case.endswith("seed"):
        assert "parameters differ before any op" in fd["reason"]
    if origin == "random":
        assert "opdiff.seed_all" in fd["reason"]


@pytest.mark.slow
def test_weight_rows_say_where_they_come_from(dumps, tmp_path):
    """The spoiled weight's row at the op reading it points at the leaf, not at 'made earlier'."""
    _compare(dumps, "tensor", "cnn-element", tmp_path)
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    fields = json.loads(lines[0])["fields"]
    rows = [dict(zip(fields, json.loads(line))) for line in lines[1:]]
    reads = [r for r in rows if r.get("op_name") == "Functional.conv2d.1.forward"
             and r.get("role") == "input" and r.get("result") == "warning"]
    assert reads, "the weight read by conv2d differs"
    assert all("made earlier" not in r["reason"] and "parameter conv2.weight" in r["reason"]
               for r in reads)


@pytest.mark.slow
def test_healthy_runs_name_no_origin(dumps, tmp_path):
    """Two healthy runs of each family: no divergence, and every leaf compared."""
    for task in TASKS:
        for family in ("cnn", "block"):
            golden = dumps / "golden" / task / family
            assert main(["compare", str(golden), str(golden), "-o", str(tmp_path / task / family),
                         "--no-progress", "--fail-on-divergence"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("inside", [False, True])
def test_a_different_learning_rate(tmp_path, inside):
    """optimizer.step() outside the recorded region: the parameters of step 1 differ although
    step 0 agreed (origin optimizer); inside it: the update op of step 0, through its lr."""
    for side, lr in (("golden", "0.1"), ("target", "0.11")):
        subprocess.run([sys.executable, str(HERE / "optimizer_run.py"), str(tmp_path / side), lr,
                        "1" if inside else "0"], check=True, timeout=300)
    rc = main(["compare", str(tmp_path / "target"), str(tmp_path / "golden"), "-o",
               str(tmp_path / "out"), "--no-progress", "--fail-on-divergence"])
    fd = json.loads((tmp_path / "out" / "summary.json").read_text())["first_divergence"]
    assert rc == 1
    if inside:
        assert (fd["origin"], fd["step"], fd["op"]) == ("number", 0, "Tensor.add_")
        assert "-0.11 vs -0.1" in fd["reason"]
    else:
        assert (fd["origin"], fd["step"], fd["tensor"]) == ("optimizer", 1, "0.weight")
        assert fd["name"] == "Functional.linear.0.forward"


def test_little_coverage_is_inconclusive():
    """A compare where most tensors have no partner does not claim agreement."""
    from opdiff.comparison.result import PASS, UNMATCHED, CompareResult, TensorRow, count
    from opdiff.report.console import verdict_line

    def row(result: str) -> TensorRow:
        return TensorRow(target_name="t", golden_name="g", op_name="Functional.relu.0.forward",
                         role="output", phase="forward", kind="api", index=0, result=result)

    rows = [row(PASS)] * 3 + [row(UNMATCHED)] * 7
    result = CompareResult(target="t", golden="g", rows=rows, first_divergence=None,
                           counts=count(rows))
    assert result.coverage == pytest.approx(0.3)
    assert verdict_line(result).startswith("inconclusive: only 30% of tensors have a partner")
    rows = [row(PASS)] * 9 + [row(UNMATCHED)]
    assert verdict_line(CompareResult(target="t", golden="g", rows=rows, first_divergence=None,
                                      counts=count(rows))).startswith("no divergence")
