"""`concat:` lines (comparison/concat.py): the file's two forms, and the statistics of a
concatenation combined from its parts' exactly where they can be (the end-to-end cases, split
q/k/v against a fused qkv projection, are in test_regions_fused_projection.py)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from opdiff.comparison.concat import join_stats
from opdiff.comparison.mapping import MappingError, load


def _stats(t: torch.Tensor) -> dict[str, float]:
    """Statistics as capture records them, in float64 over the finite values' whole tensor."""
    d = t.double()
    return {"max": d.max().item(), "min": d.min().item(), "mean": d.mean().item(),
            "norm": d.norm().item(), "nan": int(t.isnan().sum()), "inf": int(t.isinf().sum())}


def test_joined_statistics_are_those_of_the_concatenation():
    torch.manual_seed(0)
    # parts of unequal sizes (grouped-query attention: q wider than k and v)
    parts = [torch.randn(4, 32) * 3 + 1, torch.randn(4, 8) - 2, torch.randn(4, 8) * 0.1]
    whole = _stats(torch.cat(parts, -1))
    dropped: set[str] = set()
    joined = join_stats([_stats(p) for p in parts], [p.numel() for p in parts], dropped)
    assert joined is not None and not dropped
    assert joined["max"] == whole["max"] and joined["min"] == whole["min"]
    assert joined["mean"] == pytest.approx(whole["mean"], rel=1e-12)
    assert joined["norm"] == pytest.approx(whole["norm"], rel=1e-12)
    assert (joined["nan"], joined["inf"]) == (0, 0)


def test_what_cannot_be_combined_is_left_out_and_named():
    a = {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0, "nan": 1, "inf": 0, "md5": "ab"}
    b = {"max": "NaN", "min": -1.0, "mean": 0.0, "norm": 1.0, "nan": 2, "inf": 1, "md5": "cd"}
    from opdiff.store.records import decoded_stats
    dropped: set[str] = set()
    joined = join_stats([decoded_stats({"stats": a}), decoded_stats({"stats": b})], [2, 2],
                        dropped)
    assert joined is not None and dropped == {"md5"} and "md5" not in joined
    assert joined["max"] == "NaN" and joined["min"] == -1.0      # a NaN max stays NaN
    assert (joined["nan"], joined["inf"]) == (3, 1)
    assert joined["norm"] == pytest.approx(math.sqrt(5))
    assert join_stats([a, {}], [1, 1], set()) is None              # a part without statistics


def test_both_forms_parse_with_their_lines(tmp_path: Path):
    f = tmp_path / "pairs.yaml"
    f.write_text("modules:\n  npu_attn: self_attn\nconcat:\n  qkv_proj: [q_proj, k_proj, v_proj]\n"
                 "  layers.0.mlp.gate_up: {golden: [layers.0.mlp.gate, layers.0.mlp.up], dim: 1}\n")
    rules = [r for r in load(f).rules if r.kind == "concat"]
    assert [(r.old, r.parts, r.dim, r.line) for r in rules] == [
        ("qkv_proj", ("q_proj", "k_proj", "v_proj"), -1, 4),
        ("layers.0.mlp.gate_up", ("layers.0.mlp.gate", "layers.0.mlp.up"), 1, 5)]
    assert rules[0].text == "concat qkv_proj: [q_proj, k_proj, v_proj] dim -1"
    f.write_text("concat:\n  qkv_proj: {golden: [q_proj, k_proj], dim: [0]}\n")
    with pytest.raises(MappingError, match=r"pairs.yaml:2: expected a name"):
        load(f)
