"""The plan table (comparison/plans.py): which plan two recordings get, and that a plan at each
level is one row: a SOURCES row lays out each side's dumps before step/rank pairs form, a
RECORDS row rewrites a pair's records before alignment, both through the real compare."""
from __future__ import annotations

from pathlib import Path

import pytest

import opdiff
from opdiff.comparison import plans
from opdiff.comparison.plans import PAIRS, RECORDS, SOURCES, CompiledPlan, Plan, Row, plan_for
from opdiff.comparison.recording import EAGER, FX, INDUCTOR, Recording
from opdiff.comparison.result import Note
from opdiff.store.adapters import discover

from dumpkit import cnn_run


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("plans")
    for rank in (0, 1):
        cnn_run(root / "golden" / "step0" / f"rank{rank}")
        cnn_run(root / "target" / "step0" / f"rank{rank}",
                faults=[("Functional.relu", 1, 1.02)] if rank == 1 else ())
    return root / "target", root / "golden"


def _read(path: Path) -> Recording:
    dump = discover(path)[0]
    return Recording.read(dump.records(), dump.meta, format=dump.format,
                          tensors=dump.holds_tensors, step=dump.step, rank=dump.rank)


def test_a_recording_says_what_its_side_is(roots):
    side = _read(roots[0] / "step0" / "rank1")
    assert (side.format, side.backend, side.compiled, side.kernels, side.tensors, side.rank) == \
        ("opdiff", EAGER, False, False, True, 1)


def test_eager_sides_pair_op_by_op_and_compiled_ones_by_the_table(roots):
    eager = _read(roots[0] / "step0" / "rank0")
    assert type(plan_for(eager, eager)) is Plan and plan_for(eager, eager).note is None
    fx = Recording(level="L2", backend=FX)
    assert type(plan_for(fx, Recording(level="L2"))) is CompiledPlan
    assert plan_for(fx, Recording(level="L2")).note is None
    # Inductor whose own kernels were not recorded: what pairs by name, and why not more
    blind = Recording(level="L2", backend=INDUCTOR, extern=("Aten.mm",))
    said = plan_for(blind, Recording(level="L2")).note
    assert said is not None and said.startswith("inconclusive: the target ran Inductor")
    # recorded per torch call against aten ops: the last row
    said = plan_for(Recording(level="L1", backend=FX), Recording(level="mix")).note
    assert said is not None and "level L1/mix" in said
    assert all(row.level in (SOURCES, RECORDS, PAIRS) for row in plans.PLANS)


class DropRelu:
    """A RECORDS plan for the test: both sides' relu calls left out before alignment."""
    name = "no relu"

    def rewrite(self, target, golden, sources, options=None):
        keep = [r for r in target if r["op"] != "Functional.relu"]
        return plans.Rewritten(keep, [r for r in golden if r["op"] != "Functional.relu"],
                               [Note("relu left out", Note.PAIRING)])


class RankZero:
    """A SOURCES plan for the test: each side laid out as its rank 0 alone."""
    name = "rank 0"

    def arrange(self, targets, goldens, options=None):
        return [d for d in targets if d.rank == 0], [d for d in goldens if d.rank == 0], \
            [Note("rank 0 only", Note.PAIRING)]

    def made(self, source):
        return False            # (it only leaves dumps out: each is opened by its path again)

    def judged(self, result, target, golden):
        return result


def test_a_records_plan_is_one_row(roots, monkeypatch):
    target, golden = (r / "step0" / "rank1" for r in roots)
    before = opdiff.compare(str(target), str(golden), progress=False, replay="off")
    assert before.first_divergence.name == "Functional.relu.1.forward"
    monkeypatch.setattr(plans, "PLANS", (Row(RECORDS, lambda t, g: True, DropRelu()),)
                        + plans.PLANS)
    after = opdiff.compare(str(target), str(golden), progress=False, replay="off")
    assert "relu left out" in after.notes
    assert not any(r.op_name.startswith("Functional.relu") for r in after.rows)
    # (the op that made the difference is gone: the ones after it only carry it on)
    assert after.first_divergence is None and after.counts["error"] == 0


def test_a_sources_plan_is_one_row(roots, monkeypatch):
    both = opdiff.compare(str(roots[0]), str(roots[1]), progress=False, replay="off")
    assert {p["rank"] for p in both.pairs} == {0, 1}
    monkeypatch.setattr(plans, "PLANS", (Row(SOURCES, lambda t, g: True, RankZero()),)
                        + plans.PLANS)
    one = opdiff.compare(str(roots[0]), str(roots[1]), progress=False, replay="off")
    assert "rank 0 only" in one.notes and one.first_divergence is None
    assert {r.rank for r in one.rows} <= {0, None}
