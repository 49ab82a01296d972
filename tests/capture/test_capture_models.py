"""Every tiny model family at every level: a clean, complete, self-consistent dump."""
from __future__ import annotations

import pytest

import opdiff
from opdiff.store import decoded_stats, iter_tensors

@pytest.mark.parametrize("level", ["L0", "L1", "mix", "L2"])
def test_dump_of_a_training_step_is_complete_and_consistent(tiny_model, level, dump_root, read_dump):
    model, inputs, loss_fn = tiny_model.build()
    with opdiff.dump(model, dump_root, level=level, task="statistics"):
        loss_fn(model(*inputs)).backward()
    dump = read_dump(dump_root)            # strict JSON, names unique
    records = dump.records
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert not [(r["name"], r["error"]) for r in records if "error" in r]
    phases = {r["phase"] for r in records}
    assert phases == {"forward", "backward"}
    names = set(dump.by_name)
    for r in records:
        if r.get("forward") is not None:
            assert r["forward"] in names, f"{r['name']} links to a missing forward"
        if r.get("module") is not None and level != "L2":
            assert r["module"] in names, f"{r['name']} sits in a missing module call"
        if r.get("stack") is not None:
            assert dump.dump.stack(r["stack"]), f"{r['name']} has an unknown stack id"
        for tname, _role, desc in iter_tensors(r):
            stats = decoded_stats(desc)
            if 0 in desc["shape"]:
                continue
            if desc.get("overwritten") or desc.get("uninitialized"):
                # e.g. dropout's mask at L2: empty_like(x).bernoulli_(p) reads nothing of x
                assert desc["stats"] is None, tname
                continue
            assert set(stats) == {"max", "min", "mean", "norm", "nan", "inf"}, tname
            assert stats["min"] <= stats["max"], tname
            assert stats["nan"] == 0 and stats["inf"] == 0, tname
    # Every parameter's gradient is recorded somewhere at module levels.
    if level in ("L0", "mix"):
        grads = {(r["op"], p) for r in records if r["kind"] == "param_grad" for p in r["parameters"]}
        assert len(grads) == sum(1 for p in model.parameters() if p.grad is not None)
