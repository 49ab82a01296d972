"""Every dump is a DumpSource, and discovery finds formats through the registry alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.errors import DumpError
from opdiff.store import source
from opdiff.store.adapters import discover
from opdiff.store.schema import complete
from opdiff.store.source import DumpFormat, DumpSource, register_format

DATA = Path(__file__).resolve().parents[1] / "data" / "msprobe"
FOREIGN = [DATA / "statistics" / "golden", DATA / "tensor" / "golden",
           DATA / "legacy" / "ptdbg_v4", DATA / "legacy" / "npu_hooks"]


def _opdiff_dump(tmp_path, task):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    with opdiff.dump(model, str(tmp_path / task), level="mix", task=task):
        model(torch.randn(2, 3)).sum().backward()
    (dump,) = discover(tmp_path / task)
    return dump


@pytest.mark.parametrize("path", FOREIGN, ids=lambda p: p.name)
def test_foreign_dumps_are_dump_sources_without_replayable_tensors(path):
    (dump,) = discover(path)
    assert isinstance(dump, DumpSource)
    assert dump.holds_tensors is False
    assert dump.record_count() == sum(1 for _ in dump.records()) > 0


@pytest.mark.parametrize("task,holds", [("statistics", False), ("tensor", True)])
def test_opdiff_dumps_hold_their_tensors_only_in_tensor_mode(tmp_path, task, holds):
    dump = _opdiff_dump(tmp_path, task)
    assert isinstance(dump, DumpSource)
    assert dump.holds_tensors is holds
    assert dump.record_count() == sum(1 for _ in dump.records()) > 0


class _ToyDump:
    """A one-file format: `toy.json` holds a list of records."""

    format = "toy"

    def __init__(self, path: Path):
        self.path, self.meta, self.step, self.rank = path, {"tool": "toy"}, None, None
        self._records = json.loads(path.read_text())

    def records(self):
        return (complete(r) for r in self._records)     # the DumpSource contract

    def tensor(self, key):
        return None

    def tensor_keys(self):
        return []

    def stack(self, stack_id):
        return []

    @property
    def holds_tensors(self):
        return False

    def record_count(self):
        return len(self._records)


def test_a_new_format_is_one_registration(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "_FORMATS", list(source.formats()))
    toy = tmp_path / "run" / "toy.json"
    toy.parent.mkdir()
    toy.write_text(json.dumps([{"name": "Functional.relu.0.forward", "op": "Functional.relu",
                                "kind": "api", "phase": "forward"}]))
    with pytest.raises(DumpError, match="no dump found"):
        discover(tmp_path)
    register_format(DumpFormat(name="toy", describe="a toy dump (toy.json)",
                               detect=lambda f: f.name == "toy.json", open=_ToyDump))
    (dump,) = discover(tmp_path)
    assert isinstance(dump, DumpSource) and dump.record_count() == 1
    assert discover(toy)[0].format == "toy"
    # The "expected ..." message lists every registered format.
    other = tmp_path / "run" / "toy.txt"
    other.write_text("x")
    with pytest.raises(DumpError, match=r"or a toy dump \(toy.json\)"):
        discover(other)


def test_an_index_of_a_step_rank_format_wins_over_pkl_files_beside_it(tmp_path):
    rank = tmp_path / "step0" / "rank0"
    rank.mkdir(parents=True)
    for f in (DATA / "statistics" / "golden").rglob("*.json"):
        (rank / f.name).write_bytes(f.read_bytes())
    (rank / "notes.pkl").write_bytes(b"\x80\x04not ours")
    (dump,) = discover(tmp_path)
    assert dump.format == "msprobe"
