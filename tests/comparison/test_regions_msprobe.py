"""A foreign (msprobe) dump against an opdiff dump of a Llama whose attention differs (eager
against SDPA): msprobe dumps carry no dataflow, so the regions fall back to module boundaries
(the attention module call's inputs and outputs). Healthy pairs name nothing; a fault planted in
SDPA names the attention region of its layer, whichever side msprobe wrote.

The msprobe side is a real run's dump written again in msprobe's layout (`msprobekit.py`), read
through opdiff's msprobe adapter like any msprobe dump. The opdiff dumps are conftest.py's.
Its backward records keep opdiff's meaning; real msprobe records an API's backward by its last
autograd node and a module's input gradient as that module's share only, which this kit does
not imitate (those rows are not comparable across the two tools at all).
"""
from __future__ import annotations

import pytest

import opdiff
from opdiff.report.console import verdict_line
from opdiff.store.adapters import discover

from msprobekit import write_msprobe

SDPA = "Functional.scaled_dot_product_attention"
ATTENTION = "model.layers.1.self_attn"


@pytest.fixture(scope="module")
def msprobe(hf_dump, tmp_path_factory):
    root = tmp_path_factory.mktemp("msprobe")
    made = {}
    for name, impl, fault in (("eager", "eager", None), ("sdpa", "sdpa", None),
                              ("sdpa_fault", "sdpa", f"{SDPA}:1")):
        opdiff_dump = hf_dump("llama", impl, "statistics", fault=fault)
        made[name] = write_msprobe(opdiff_dump / "step0" / "rank0", root / name)
        made["opdiff", name] = opdiff_dump
    (dump,) = discover(made["eager"])
    assert dump.format == "msprobe" and not (dump.meta or {}).get("dataflow")
    return made


# (target, golden): msprobe golden against an opdiff target, and the other way round
SIDES = {"msprobe golden": (("opdiff", "sdpa"), "eager"),
         "msprobe target": ("sdpa", ("opdiff", "eager"))}


def _compare(msprobe, sides: str, fault: bool):
    target, golden = SIDES[sides]
    if fault:
        target = (target[0], "sdpa_fault") if isinstance(target, tuple) else "sdpa_fault"
    return opdiff.compare(str(msprobe[target]), str(msprobe[golden]), progress=False)


@pytest.mark.parametrize("sides", list(SIDES))
def test_healthy_pairs_name_nothing(msprobe, sides):
    result = _compare(msprobe, sides, fault=False)
    assert result.first_divergence is None, result.first_divergence
    assert not verdict_line(result).startswith("inconclusive"), verdict_line(result)
    region_rows = [r for r in result.rows if r.region]
    assert any(SDPA in (r.target_name or r.golden_name or "") for r in region_rows)
    # every region was judged (none left "not judged") and nothing is an error
    assert all(r.result == "pass" for r in region_rows), \
        {r.reason for r in region_rows if r.result != "pass"}
    assert result.counts["error"] == 0


@pytest.mark.parametrize("sides", list(SIDES))
def test_a_fault_in_sdpa_names_the_attention_region_of_its_layer(msprobe, sides):
    result = _compare(msprobe, sides, fault=True)
    first = result.first_divergence
    assert first is not None and first.origin == "region", verdict_line(result)
    assert first.phase == "forward"
    assert [o["op"] for o in first.region["target_ops"]][0] == SDPA
    assert "Torch.matmul" in {o["op"] for o in first.region["golden_ops"]}
    assert f"region in `{ATTENTION}`" in first.reason, first.reason
    assert "local error in this region" in first.reason
    if sides == "msprobe target":
        # no dataflow on the target: judged at the attention module call's boundary
        (region,) = [r for f in result.facts for r in f.regions if r.name == first.name]
        assert region.how == "module"
        boundary = [r for r in result.rows if r.target_name in region.outputs]
        assert boundary and all(r.op_name.startswith(f"Module.{ATTENTION}.") for r in boundary), \
            [r.op_name for r in boundary]
