"""The statistics table (store/statistics.py): one row per statistic, tied to the record type,
the schema, the CSV and what capture writes; and `merge`, exact in float64 for a tensor's pieces
where the layout allows it."""
from __future__ import annotations

import json
import math
from typing import get_type_hints

import pytest
import torch

import opdiff
from opdiff.report import columns
from opdiff.store import record_schema, statistics
from opdiff.store.records import decode_float
from opdiff.store.schema import Statistics
from opdiff.store.statistics import CONCAT, PARTIAL, REPLICA, Piece, merge


def _stats(t: torch.Tensor) -> dict:
    """A tensor's statistics, computed in float64 as a reference."""
    d = t.double()
    return {"max": d.max().item(), "min": d.min().item(), "mean": d.mean().item(),
            "norm": d.norm().item(), "nan": int(t.isnan().sum()), "inf": int(t.isinf().sum())}


def _pieces(parts: list[torch.Tensor]) -> list[Piece]:
    return [Piece(_stats(p), p.numel()) for p in parts]


def _close(merged: dict, whole: dict, keys) -> None:
    for key in keys:
        a, b = decode_float(merged[key]), whole[key]
        if isinstance(b, float) and math.isnan(b):
            assert math.isnan(a), key
        else:
            assert a == pytest.approx(b, rel=1e-12, abs=0), key


def test_the_table_is_the_record_type_the_schema_and_the_csv():
    assert statistics.KEYS == tuple(Statistics.__annotations__)
    hints = get_type_hints(Statistics)
    for stat in statistics.STATISTICS:
        assert (int in hints[stat.key].__args__) == (stat.value is int), stat.key
    stats_def = record_schema.json_schema()["$defs"]["statistics"]["properties"]
    assert tuple(stats_def) == statistics.KEYS
    assert columns.STATS == statistics.COLUMNS
    header = [c.header for c in columns.STATISTICS]
    assert header[:4] == ["NPU max", "NPU min", "NPU mean", "NPU l2norm"]


def test_capture_writes_the_tables_statistics_in_its_order(tmp_path):
    model = torch.nn.Linear(4, 3)
    with opdiff.dump(model, str(tmp_path), level="L1"):
        model(torch.randn(2, 4)).sum()
    found = [tuple(d["stats"]) for f in tmp_path.rglob("records.jsonl")
             for line in f.read_text().splitlines()
             for d in json.loads(line)["outputs"] if d.get("stats")]
    assert found and set(found) == {statistics.KEYS}


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_merged_shards_are_the_whole_tensors_statistics(dim):
    torch.manual_seed(0)
    whole = torch.randn(12, 10, dtype=torch.float64) * 3 + 0.5
    whole[0, 0] = 1e6                       # one large value: the mean and norm are not trivial
    sizes = [5, 4, 3] if whole.shape[dim] == 12 else [6, 1, 3]
    parts = list(torch.split(whole, sizes, dim=dim))
    merged = merge(_pieces(parts))
    assert list(merged) == list(statistics.KEYS)
    _close(merged, _stats(whole), statistics.KEYS)
    assert merged["max"] == 1e6 and (merged["nan"], merged["inf"]) == (0, 0)


def test_shards_with_nan_and_inf_merge_as_the_whole():
    whole = torch.tensor([1.0, -2.0, math.inf, 3.0, math.nan, -5.0, 0.5, 7.0], dtype=torch.float64)
    merged = merge(_pieces(list(torch.split(whole, [3, 3, 2]))))
    ref = _stats(whole)
    _close(merged, ref, statistics.KEYS)
    assert merged["max"] == "NaN" and merged["norm"] == "NaN" and (merged["nan"], merged["inf"]) == (1, 1)
    # an inf in one piece and -inf in another: the mean of the whole is NaN, its norm inf
    pm = torch.tensor([math.inf, 1.0, -math.inf, 2.0], dtype=torch.float64)
    merged = merge(_pieces([pm[:2], pm[2:]]))
    assert merged["mean"] == "NaN" and merged["norm"] == "Infinity" and merged["inf"] == 2


def test_a_partial_sum_keeps_only_its_mean():
    torch.manual_seed(1)
    terms = [torch.randn(6, 4, dtype=torch.float64) for _ in range(3)]
    dropped: set[str] = set()
    merged = merge(_pieces(terms), PARTIAL, dropped)
    assert list(merged) == ["mean"] and dropped == {"max", "min", "norm", "nan", "inf"}
    assert decode_float(merged["mean"]) == pytest.approx(sum(terms).mean().item(), rel=1e-12)
    # terms of different sizes are no partial sum of one tensor
    assert merge(_pieces([terms[0], terms[1][:3]]), PARTIAL) == {}


def test_descriptors_of_a_tensors_shards_merge_through_their_shapes(tmp_path):
    """Pieces made from real descriptors (what capture wrote for two shards of one tensor)."""
    torch.manual_seed(2)
    whole = torch.randn(6, 5)
    model = torch.nn.Identity()
    with opdiff.dump(model, str(tmp_path), level="L1"):
        shards = [torch.relu(part) for part in torch.split(whole, [4, 2])]
    relu = [json.loads(line) for f in tmp_path.rglob("records.jsonl") for line in f.read_text().splitlines()]
    descs = [r["outputs"][0] for r in relu if r["op"] == "Torch.relu"]
    assert len(descs) == 2
    merged = merge([statistics.piece(d) for d in descs])
    ref = _stats(torch.cat(shards))
    for key in ("max", "min", "nan", "inf"):
        assert decode_float(merged[key]) == ref[key], key
    # (capture's own float32-read statistics: the merge is exact, the pieces are not float64)
    assert decode_float(merged["mean"]) == pytest.approx(ref["mean"], rel=1e-6)
    assert decode_float(merged["norm"]) == pytest.approx(ref["norm"], rel=1e-6)
    assert statistics.piece({"type": "tensor", "shape": [2, 3], "stats": None}) == Piece(None, 6)


def test_replicas_agree_or_are_unknown():
    t = torch.randn(5, dtype=torch.float64)
    assert merge(_pieces([t, t.clone()]), REPLICA) == merge(_pieces([t]), CONCAT)
    dropped: set[str] = set()
    other = t.clone()
    other[0] = 100.0
    merged = merge(_pieces([t, other]), REPLICA, dropped)
    assert "max" in dropped and "max" not in merged and "nan" in merged


def test_what_no_row_knows_or_a_piece_lacks_is_left_out():
    dropped: set[str] = set()
    merged = merge([Piece({"max": 1.0, "md5": "ab"}, 2), Piece({"max": 2.0, "md5": "cd"}, 2)],
                   dropped=dropped)
    assert merged == {"max": 2.0} and dropped == {"md5"}
    dropped = set()
    assert merge([Piece({"max": 1.0, "min": 0.0}, 2), Piece({"max": 2.0}, 2)], dropped=dropped) == {"max": 2.0}
    assert dropped == {"min"}
    assert merge([Piece({"max": 1.0}, 2), Piece(None, 3)]) is None
    assert merge([Piece({"max": 1.0}, 2), Piece(None, 0)]) == {"max": 1.0}   # an empty piece
    with pytest.raises(ValueError):
        merge([Piece({"max": 1.0}, 2)], "diagonal")
