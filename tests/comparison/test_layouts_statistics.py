"""Statistics merged from uneven pieces equal the whole tensor's (comparison/layouts/statistics.py):
a real capture records `relu` of an 18-row tensor and of its 4 uneven chunks (5, 5, 5, 3 rows,
as torch.chunk and DTensor split a dim of 18 over 4 ranks); the chunks' statistics merged in
float64 equal the whole's to 1e-12 relative, which msprobe's unweighted mean of means does not."""
from __future__ import annotations

import math

import torch

import opdiff
from opdiff.comparison.layouts.statistics import merge_shards, same
from opdiff.store.adapters import discover


def _outputs(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(18, 7) + 0.5
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", task="statistics")
    dbg.start()
    torch.relu(x)
    for piece in x.chunk(4, dim=0):
        torch.relu(piece)
    dbg.stop()
    dbg.step()
    records = [r for r in discover(str(tmp_path / "d"))[0].records() if r["op"] == "Torch.relu"]
    return [r["outputs"][0] for r in records]


def test_uneven_pieces_merge_to_the_whole_tensors_statistics(tmp_path):
    whole, *pieces = _outputs(tmp_path)
    assert [p["shape"][0] for p in pieces] == [5, 5, 5, 3]
    merged = merge_shards([p["stats"] for p in pieces], [math.prod(p["shape"]) for p in pieces])
    assert merged is not None
    for key in ("max", "min", "mean", "norm"):
        assert math.isclose(float(merged[key]), float(whole["stats"][key]), rel_tol=1e-12), key
    assert merged["nan"] == merged["inf"] == 0
    # an unweighted mean of the pieces' means (msprobe's) is not the whole's mean here
    plain = sum(float(p["stats"]["mean"]) for p in pieces) / len(pieces)
    assert not math.isclose(plain, float(whole["stats"]["mean"]), rel_tol=1e-6)


def test_replicas_are_the_same_only_when_every_statistic_is(tmp_path):
    whole, *pieces = _outputs(tmp_path)
    assert same(whole["stats"], dict(whole["stats"]))
    assert not same(whole["stats"], pieces[0]["stats"])


def test_a_piece_without_statistics_merges_to_none():
    assert merge_shards([{"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 1.0}, None], [2, 2]) is None
