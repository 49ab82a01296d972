"""Real two-step, two-rank dumps of a small MLP (a gelu fault planted in the target), shared by
the incomplete-dump, streaming and Ray engine tests. The rank1 directories are copies of rank0's
(`rank_dumps.dump_ranks`): laying out a two-rank root needs no process group (the gloo tests run
real ones)."""
from __future__ import annotations

import pytest
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
