"""The comparison asks a dump only what `DumpSource` declares: no format names, no file layout."""
import pytest

from opdiff.comparison.pair import compare_pair
from opdiff.comparison.runs import count_records
from opdiff.store.adapters import discover

from dumpkit import cnn_run


class Foreign:
    """An opdiff dump presented as some other tool's: another format name, declared capabilities."""

    def __init__(self, dump, holds_tensors: bool):
        self._dump, self._holds = dump, holds_tensors
        self.format = "mytool"

    def __getattr__(self, name):
        return getattr(self._dump, name)

    @property
    def holds_tensors(self) -> bool:
        return self._holds

    def record_count(self) -> int:
        return 7


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    cnn_run(root / "golden")
    cnn_run(root / "target", faults=[("Functional.conv2d", 1, 1 + 1e-3)])
    return discover(root / "target")[0], discover(root / "golden")[0]


@pytest.mark.parametrize("holds, replayed", [(True, True), (False, False)])
def test_replay_follows_holds_tensors_not_the_format_name(dumps, holds, replayed):
    target, golden = dumps
    result = compare_pair(Foreign(target, holds), golden)
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Functional.conv2d.1.forward"
    assert any(n.startswith("replayed ") for n in result.notes) is replayed


def test_the_progress_total_is_the_sources_record_count(dumps):
    target, _ = dumps
    assert count_records(Foreign(target, True)) == 7
    assert count_records(target) == len(list(target.records())) > 0
