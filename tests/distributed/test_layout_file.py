"""A layout file (`--layout`, comparison/layouts/declared.py) for ranks that split a model by hand
with plain tensors (Megatron-style column/row-parallel linears, `manual_tp_runs.py`), compared
with the same model on one process. With the file the two ranks are merged into one run (the
placements it implies fed to the layout plan), so a healthy pair names nothing and a 1% fault on
rank 1's shard is named at its op (tensor dumps: with rank 1). Without it the ranks cannot be
merged, and the pair is "inconclusive: ... give a layout file (--layout)": before, rank 0 was
compared with the whole run and an innocent op on rank 0 was named. Bad lines exit 2 naming
file:line.

One spawn per run, shared by the tests (session fixture): ~30 s a run here without load.
"""
from __future__ import annotations

import pytest
import torch.distributed as dist
from manual_tp_runs import LAYOUT, STAGES, run, run_stages

import opdiff
from opdiff.cli import main

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]


@pytest.fixture(scope="session")
def manual(tmp_path_factory):
    """{run: root} and the layout file; each root holds a statistics and a tensor dump."""
    tmp = tmp_path_factory.mktemp("manual_tp")
    layout = tmp / "layout.txt"
    layout.write_text(LAYOUT)
    stages = tmp / "stages.txt"
    stages.write_text(STAGES)
    return {"one": run(tmp, "one", -2), "tp": run(tmp, "tp", -1),
            "faulty": run(tmp, "faulty", 1), "layout": str(layout),
            "pp": run_stages(tmp, "pp", -1), "pp_faulty": run_stages(tmp, "pp_faulty", 0),
            "pp_one": run_stages(tmp, "pp_one", -2),
            "stages": str(stages)}


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_hand_split_run_with_its_layout_file_names_nothing(manual, task):
    result = opdiff.compare(f"{manual['tp']}/{task}", f"{manual['one']}/{task}",
                            layout=manual["layout"])
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == 0, result.counts
    assert not any(n.startswith("inconclusive") for n in result.notes), result.notes
    assert "inconclusive" not in result.verdict
    total = sum(result.counts.values())
    assert result.counts["unmatched"] <= 0.02 * total, result.counts
    assert any("ranks [0, 1] were merged into one run" in n for n in result.notes)
    assert not any("copy of" in n for n in result.notes), result.notes    # replicas agree
    if task == "tensor":      # every tensor scored, the partial sums too
        assert result.counts["warning"] == 0, result.counts
    else:                     # but the backward partial sum nothing recorded the reduction of
        assert result.counts["warning"] <= 1, result.counts


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_on_rank_1s_shard_is_named_at_its_op(manual, task):
    result = opdiff.compare(f"{manual['faulty']}/{task}", f"{manual['one']}/{task}",
                            layout=manual["layout"])
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.location is not None and fd.location.line > 0
    if task == "tensor":
        assert fd.rank == 1, fd
        assert "rank 1's piece of Functional.gelu.1.forward.output.0" in fd.reason
    else:                     # statistics cannot say which piece: the ranks it was merged from
        assert "merged from ranks [0, 1]" in fd.reason


@pytest.mark.parametrize("name", ["tp", "faulty"])
def test_without_the_file_no_rank_is_blamed_and_the_file_is_asked_for(manual, name):
    for task in ("statistics", "tensor"):
        result = opdiff.compare(f"{manual[name]}/{task}", f"{manual['one']}/{task}")
        assert result.first_divergence is None, result.first_divergence
        assert result.verdict.startswith("inconclusive"), result.verdict
        assert any("give a layout file (--layout)" in n for n in result.notes), result.notes


def test_the_cli_takes_the_layout_file(manual, capsys):
    code = main(["compare", f"{manual['faulty']}/statistics", f"{manual['one']}/statistics",
                 "--layout", manual["layout"], "--fail-on-divergence"])
    out = capsys.readouterr().out
    assert code == 1 and "Functional.gelu.1.forward" in out


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_pipeline_stages_in_another_order_than_the_ranks_chain_by_the_file(manual, task):
    healthy = opdiff.compare(f"{manual['pp']}/{task}", f"{manual['pp_one']}/{task}",
                             layout=manual["stages"])
    assert healthy.first_divergence is None, healthy.first_divergence
    assert healthy.counts["error"] == healthy.counts["unmatched"] == 0, healthy.counts
    assert not any(n.startswith("inconclusive") for n in healthy.notes), healthy.notes
    assert any("ranks [1, 0] were chained into one run as pipeline stages 0 to 1, as the "
               "layout file says" in n for n in healthy.notes), healthy.notes
    faulty = opdiff.compare(f"{manual['pp_faulty']}/{task}", f"{manual['pp_one']}/{task}",
                            layout=manual["stages"])
    fd = faulty.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.rank == 0 and "run on rank 0 (pipeline stage 1)" in fd.reason, fd


def test_without_the_file_the_stage_order_is_read_from_the_sends(manual):
    """Stage 0 sends before it receives: the ranks are chained [1, 0] (before: in rank order,
    and the pair named `Functional.linear.0.forward`'s input, 46 rows unmatched)."""
    for task in ("statistics", "tensor"):
        healthy = opdiff.compare(f"{manual['pp']}/{task}", f"{manual['pp_one']}/{task}")
        assert healthy.first_divergence is None, healthy.first_divergence
        assert healthy.counts["error"] == healthy.counts["unmatched"] == 0, healthy.counts
        assert any("ranks [1, 0] were chained" in n for n in healthy.notes), healthy.notes
        fd = opdiff.compare(f"{manual['pp_faulty']}/{task}",
                            f"{manual['pp_one']}/{task}").first_divergence
        assert fd is not None and fd.name == "Functional.gelu.1.forward" and fd.rank == 0, fd


@pytest.mark.parametrize("text,line,said", [
    ("stage 0 ranks=1\nstage 1 ranks=7\n", 2, "rank 7 is not in the target's dump"),
    ("stage 0 ranks=1\nstage 0 ranks=0\n", 2, "stage 0 is given already on line 1"),
    ("stage 0 ranks=1\nstage 2 ranks=0\n", 2, "stage 2 without stage 1"),
    ("stage 0 ranks=1\ncolumn 0\n", 2, "'stage' and 'column'/'row' lines in one file"),
])
def test_a_bad_stage_line_exits_2_naming_file_and_line(manual, tmp_path, capsys, text, line, said):
    bad = tmp_path / "bad_stages.txt"
    bad.write_text(text)
    code = main(["compare", f"{manual['pp']}/statistics", f"{manual['pp_one']}/statistics",
                 "--layout", str(bad)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{bad}:{line}: " in err and said in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("text,line,said", [
    ("column 0\nrow 2\ncolumn layers.7\n", 3, "no parameter of a module 'layers.7'"),
    ("column 0\nrow 2 dim=one\n", 2, "dim='one'"),
    ("column 0 dim=2\n", 1, "dim=2: the weight of '0' has 2 dims"),
    ("# ranks\ncolumn 0 ranks=0,5\n", 2, "rank(s) [5] are not in the target's dump"),
    ("column 0\nrow 2\n\ncolumn 0 dim=0\n", 4, "module '0' is laid out already on line 1"),
    ("split 0\n", 1, "unknown word 'split'"),
])
def test_a_bad_line_exits_2_naming_file_and_line(manual, tmp_path, capsys, text, line, said):
    bad = tmp_path / "bad_layout.txt"
    bad.write_text(text)
    code = main(["compare", f"{manual['tp']}/statistics", f"{manual['one']}/statistics",
                 "--layout", str(bad)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{bad}:{line}: " in err and said in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_golden_side_takes_its_own_layout_file(manual):
    result = opdiff.compare(f"{manual['one']}/tensor", f"{manual['tp']}/tensor",
                            golden_layout=manual["layout"])
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0, result.counts
    assert any("golden's ranks [0, 1] were merged into one run" in n for n in result.notes)


def test_a_layout_file_with_nothing_to_say_is_said_unused(manual):
    result = opdiff.compare(f"{manual['tp']}/statistics", f"{manual['tp']}/statistics",
                            layout=manual["layout"])
    assert any(n.startswith(f"the target's layout file {manual['layout']} was not used")
               for n in result.notes), result.notes
