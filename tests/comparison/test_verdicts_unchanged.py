"""The comparison's verdicts, before and after a change of its structure: a fixed set of real
dump pairs (one op's fault, SDPA against eager attention, a fused block against its composite,
eager against aot_eager at L2 and against Inductor at mix and at L2, statistics and tensor
dumps, several ranks) compared, written, loaded back and re-judged; what each gave (first
divergence, its kind and origin, counts, notes' kinds, region rows) is checked against
data/verdicts_unchanged.json, which main gave at 74bd39e before the plan table (issue 43).

Only exact structure is kept (names, kinds, counts): no float, nothing that depends on the
machine (replay's own notes are left out: how far it ran ahead depends on the load). To record it again after a change that is meant to change a verdict, run this file
with OPDIFF_RECORD_VERDICTS=1 and say in the commit which verdict changed and why.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import opdiff
from opdiff import schemas
from opdiff.comparison.rejudge import rejudge
from opdiff.comparison.result import CompareResult, Note, note_kind
from opdiff.report.summary import load_summary

from dumpkit import cnn_run
from factskit import as_older
from regionkit import block_dump

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
from compilekit import fresh_compile, run_step, wrong_silu_decomposition  # noqa: E402

EXPECTED = Path(__file__).parent / "data" / "verdicts_unchanged.json"
RECORD = os.environ.get("OPDIFF_RECORD_VERDICTS") == "1"
FACTS: dict[str, list[dict[str, Any]]] = {}     # output folder -> the compare's facts


def digest(result: CompareResult) -> dict[str, Any]:
    """What a compare decided, as exact structure."""
    first = result.first_divergence
    return {
        "first": None if first is None else {
            "name": first.name, "kind": first.kind, "origin": first.origin,
            "tensor": first.tensor, "step": first.step, "rank": first.rank,
            "region_ops": None if first.region is None else [
                len(first.region.get("target_ops") or []),
                len(first.region.get("golden_ops") or [])]},
        "counts": dict(sorted(result.counts.items())),
        # (how much replay did depends on the machine's load: a second replay thread runs ahead
        # where a core is idle, `replay.threads`; what it decided is in `first`)
        "notes": [note_kind(n) for n in result.notes if note_kind(n) != Note.REPLAY],
        "region_rows": sum(1 for r in result.rows if r.region),
        "pairs": [[p.get("step"), p.get("rank"),
                   (p.get("first_divergence").name if p.get("first_divergence") else None)]
                  for p in result.pairs],
    }


def judged(target: Path, golden: Path, out: Path, **options: Any) -> dict[str, Any]:
    """compare, then rejudge what it wrote (loaded back from summary.json), and what it wrote
    as an older opdiff wrote it (the plan's facts as row marks: `PairFacts.from_marks`)."""
    result = opdiff.compare(str(target), str(golden), str(out), progress=False, **options)
    schemas.validate("compare-summary", json.loads((out / "summary.json").read_text()))
    saved = load_summary(out)
    again = digest(rejudge(saved))
    assert [f.to_json() for f in saved.facts] == [f.to_json() for f in result.facts]
    assert digest(rejudge(as_older(saved))) == again
    FACTS[out.name] = [f.to_json() for f in result.facts]
    return {"compare": digest(result), "rejudge": again}


def _cnn(root: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    golden = root / "cnn_golden"
    for step in (0, 1):
        for rank in (0, 1):
            cnn_run(golden / f"step{step}" / f"rank{rank}", seed=step)
    fault = root / "cnn_fault" / "step0" / "rank0"
    cnn_run(fault, faults=[("Functional.conv2d", 1, 1 + 1e-3)])
    bf16 = root / "cnn_bf16"
    for step in (0, 1):
        for rank in (0, 1):
            cnn_run(bf16 / f"step{step}" / f"rank{rank}", bf16=True, seed=step,
                    faults=[("Functional.linear", 0, 1.05)] if (step, rank) == (1, 1) else ())
    stats = root / "cnn_stats" / "step0" / "rank0"
    cnn_run(stats, faults=[("Functional.relu", 1, 1.02)], save_tensors=False)
    return {
        "same_op_fault_tensor": lambda: judged(fault, golden / "step0" / "rank0", root / "o1"),
        "same_op_fault_no_replay": lambda: judged(fault, golden / "step0" / "rank0", root / "o2",
                                                  replay="off"),
        "same_op_fault_statistics": lambda: judged(stats, golden / "step0" / "rank0",
                                                   root / "o3"),
        "multi_rank_bf16": lambda: judged(bf16, golden, root / "o4"),
    }


def _regions(root: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    from regionkit import make_dump

    g_stats = make_dump(root / "llama_eager_s", "llama", "eager", "statistics")
    t_stats = make_dump(root / "llama_sdpa_s", "llama", "sdpa", "statistics",
                        fault="Functional.silu:1")
    t_healthy = make_dump(root / "llama_sdpa_h", "llama", "sdpa", "statistics")
    composite = block_dump(root / "block_composite", fused=False)
    fused = block_dump(root / "block_fused", fused=True, fault="Functional.linear")
    fused_sdpa = block_dump(root / "block_fused_sdpa", fused=True,
                            fault="Functional.scaled_dot_product_attention")
    return {
        "sdpa_vs_eager_fault_statistics": lambda: judged(t_stats, g_stats, root / "o5"),
        "sdpa_vs_eager_healthy_statistics": lambda: judged(t_healthy, g_stats, root / "o6"),
        "fused_vs_composite_linear_fault": lambda: judged(fused, composite, root / "o7"),
        "fused_vs_composite_region_fault": lambda: judged(fused_sdpa, composite, root / "o8"),
    }


def _compiled(root: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    eager_l2 = run_step(root / "eager_l2", "L2").path
    eager_mix = run_step(root / "eager_mix", "mix").path
    aot = run_step(root / "aot_l2", "L2", backend="aot_eager", fault="silu:1").path
    with wrong_silu_decomposition():
        mix = run_step(root / "inductor_mix", "mix", backend="inductor").path
    with fresh_compile():
        l2 = run_step(root / "inductor_l2", "L2", backend="inductor").path
    return {
        "aot_eager_l2_fault": lambda: judged(aot, eager_l2, root / "o9"),
        "inductor_mix_silu": lambda: judged(mix, eager_mix, root / "o10"),
        "inductor_l2_healthy": lambda: judged(l2, eager_l2, root / "o11"),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Callable[[], dict[str, Any]]]:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("verdicts")
    return {**_cnn(root), **_regions(root), **_compiled(root)}


@pytest.mark.slow
def test_every_verdict_is_what_main_gave(cases):
    got = {name: make() for name, make in cases.items()}
    if RECORD:
        EXPECTED.parent.mkdir(exist_ok=True)
        EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    expected = json.loads(EXPECTED.read_text())
    assert sorted(got) == sorted(expected)
    for name in expected:
        for side in ("compare", "rejudge"):
            for key in expected[name][side]:
                assert got[name][side][key] == expected[name][side][key], (name, side, key)
    # the set holds what it says it holds (a case that found nothing checks nothing of blame)
    assert expected["same_op_fault_tensor"]["compare"]["first"]["name"] == \
        "Functional.conv2d.1.forward"
    assert expected["fused_vs_composite_region_fault"]["compare"]["first"]["origin"] == "region"
    assert expected["inductor_mix_silu"]["compare"]["first"] is not None
    assert any(p[2] for p in expected["multi_rank_bf16"]["compare"]["pairs"])
    # the Inductor compare at mix decided what blame may not name (its compiled backward's
    # parameter gradients), and rejudge read it back from summary.json (`judged`)
    assert FACTS["o10"] and FACTS["o10"][0]["withheld"], FACTS["o10"]
