"""Real two-step, two-rank dumps of a small MLP (a gelu fault planted in the target), shared by
the incomplete-dump, streaming and Ray engine tests. The rank1 directories are copies of rank0's
(`rank_dumps.dump_ranks`): laying out a two-rank root needs no process group (the gloo tests run
real ones).

The spawned tensor-parallel and pipeline runs (layout_runs.py) shared by every test that reads
them: `tp_roots`/`tp_runs`/`tp_tensors`, `pp_roots` (one spawn each per session)."""
from __future__ import annotations

import pytest
from layout_runs import run_layout
from rank_dumps import dump_ranks


@pytest.fixture(scope="session")
def roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("incomplete")
    return (dump_ranks(tmp / "target", task="tensor", ranks=2, steps=2, faulty={0}),
            dump_ranks(tmp / "golden", task="tensor", ranks=2, steps=2))


@pytest.fixture(scope="session")
def local(roots):
    """The local engine's compare of `roots`: what the Ray engine must give row for row."""
    import opdiff

    return opdiff.compare(str(roots[0]), str(roots[1]))


@pytest.fixture(scope="session")
def tp_roots(tmp_path_factory):
    """{run: root}; each root holds a statistics and a tensor dump (two spawns: 2 and 4 ranks)."""
    tmp = tmp_path_factory.mktemp("layouts")
    return {**run_layout(tmp, "tp", 2, "one", "tp", "faulty:Functional.gelu:1", "replica"),
            "tp4": run_layout(tmp, "tp", 4, "tp4")["tp4"]}


@pytest.fixture(scope="session")
def tp_runs(tp_roots):
    return {name: f"{root}/statistics" for name, root in tp_roots.items()}


@pytest.fixture(scope="session")
def tp_tensors(tp_roots):
    return {name: f"{root}/tensor" for name, root in tp_roots.items()}


@pytest.fixture(scope="session")
def pp_roots(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("pipeline"), "pipeline", 2,
                      "one", "pp", "faulty:Functional.gelu:0")
