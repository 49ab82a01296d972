"""Regions of eager against a compiled run, on records alone: golden's ops put back in its order
where extern kernels paired out of place (`compiled_params.in_golden_order`), a region whose
results only a later region reads joins it (`compiled_regions.joined`), and a region reading a
tensor another judged region made, compared nowhere, judged from what that tensor was made of
(`region_boundaries.Boundaries`, upstream) — never through an op no region judged."""
from __future__ import annotations

from opdiff.comparison.compiled_params import in_golden_order
from opdiff.comparison.compiled_regions import joined
from opdiff.comparison.region_boundaries import Boundaries
from opdiff.comparison.regions import Region
from opdiff.store.schema import complete


def t(shape=(2, 4), producer=None, leaf=None, fqn=None):
    d = {"type": "tensor", "dtype": "float32", "shape": list(shape)}
    if producer is not None:
        d["producer"] = list(producer)
    if leaf:
        d.update(leaf=leaf, fqn=fqn)
    return d


def op(name, seq, ins, outs=1, kind="kernel"):
    o, _, phase = name.rsplit(".", 2)
    return complete({"name": name, "op": o, "phase": phase, "kind": kind, "seq": seq,
                     "module": None, "inputs": ins, "outputs": [t() for _ in range(outs)]})


def test_golden_ops_return_before_the_first_pair_that_must_follow_them():
    golden = [complete({"name": f"Aten.x.{j}.forward", "op": "Aten.x", "phase": "forward",
                        "kind": "aten"}) for j in range(5)]
    # Inductor ran k's mm (golden 2) before q's (golden 1); the alignment left golden's norm
    # (0) and rotary (3) ops ahead of every target op
    pairs = [(None, 0), (None, 3), (0, None), (1, 2), (2, 1), (3, None), (4, 4)]
    assert in_golden_order(pairs, golden) == [
        (0, None), (None, 0), (1, 2), (2, 1), (3, None), (None, 3), (4, 4)]
    # in order already: unchanged
    ordered = [(0, None), (None, 0), (1, 1), (None, 2), (2, 3)]
    assert in_golden_order(ordered, golden) == ordered


def _chain():
    """A (kernel) -> M (paired mm, reads A.0) ; A.1 -> B (kernel) with M.0 -> C (paired)."""
    return [
        complete({"name": "Parameter.w.0.forward", "op": "Parameter.w", "phase": "forward",
                  "kind": "leaf", "leaf": "parameter", "tensor": "w", "seq": None,
                  "module": None, "inputs": [], "outputs": [t()]}),
        op("Inductor.a.0.forward", 1, [t(leaf="parameter", fqn="w")], outs=2),
        op("Aten.mm.0.forward", 2, [t(producer=(1, 0))], kind="aten"),
        op("Inductor.b.0.forward", 3, [t(producer=(1, 1)), t(producer=(2, 0))]),
        op("Aten.mm.1.forward", 4, [t(producer=(3, 0))], kind="aten"),
    ]


def _measured():
    names = ["Parameter.w.0.forward.output.0", "Aten.mm.0.forward.input.0",
             "Aten.mm.0.forward.output.0", "Aten.mm.1.forward.input.0"]
    return {n: (i, None, "float32", "float32") for i, n in enumerate(names)}


def test_a_region_reading_what_a_judged_region_made_is_judged_from_its_inputs():
    target = _chain()
    regions = [Region(0, "forward", [1], [0]), Region(1, "forward", [3], [1])]
    bounds = Boundaries(target, True, _measured(), {}, [], upstream=True)
    made = bounds.consumers(regions)
    assert bounds.by_dataflow(regions[0], made[0]) is not None
    found = bounds.by_dataflow(regions[1], made[1])
    assert found is not None
    inputs, outputs = found
    assert sorted(e[0] for e in inputs) == [0, 2]       # w (through A) and mm.0's output
    assert [e[0] for e in outputs] == [3]
    assert regions[1].through == ["Inductor.a.0.forward"]
    # named by how A read it
    assert bounds.entering(regions[1])["Parameter.w.0.forward.output.0"][0] == "Inductor.a"
    # without upstream (an eager pair): not by dataflow, as before
    plain = Boundaries(target, True, _measured(), {}, [])
    plain.consumers(regions)
    assert plain.by_dataflow(regions[1], made[1]) is None


def test_never_traced_through_an_op_no_region_judged():
    target = _chain()
    # A in no region (unmatched): B's input from it is not compared, and B is not judged
    regions = [Region(0, "forward", [3], [1])]
    bounds = Boundaries(target, True, _measured(), {}, [], upstream=True)
    made = bounds.consumers(regions)
    assert bounds.by_dataflow(regions[0], made[0]) is None
    # nor through a region judged after it (A's region not found before B's)
    regions = [Region(0, "forward", [3], [1]), Region(1, "forward", [1], [0])]
    bounds = Boundaries(target, True, _measured(), {}, [], upstream=True)
    made = bounds.consumers(regions)
    assert bounds.by_dataflow(regions[0], made[0]) is None


def test_a_region_whose_results_only_a_later_region_reads_joins_it():
    target = [
        op("Inductor.k_rotary.0.forward", 1, [t()]),
        op("Aten.mm.0.forward", 2, [t()], kind="aten"),
        op("Inductor.attention.0.forward", 3, [t(producer=(1, 0)), t(producer=(2, 0))]),
        op("Aten.mm.1.forward", 4, [t(producer=(3, 0))], kind="aten"),
        op("Inductor.norm.0.forward", 5, [t(producer=(4, 0))]),
        op("Aten.mm.2.forward", 6, [t(producer=(5, 0))], kind="aten"),
    ]
    regions = [Region(0, "forward", [0], [0, 1]), Region(1, "forward", [2], [3]),
               Region(2, "forward", [4], [5])]
    out = joined(regions, target)
    assert [(r.number, r.target, r.golden) for r in out] == [(0, [0, 2], [0, 1, 3]),
                                                            (1, [4], [5])]
    # a region read by a paired op stays itself
    regions = [Region(0, "forward", [2], [3]), Region(1, "forward", [4], [5])]
    assert [r.target for r in joined(regions, target)] == [[2], [4]]
