"""What a region covers beyond its ops (comparison/region_cover.py, regions.absorb): one-sided ops
whose results nothing reads join a region only with their run, and a tensor only one side of a
paired module call holds is the region's only when that call holds a region or a region made it."""
from __future__ import annotations

from opdiff.comparison.region_cover import covered_tensors
from opdiff.comparison.regions import Region, absorb
from opdiff.store.schema import complete

ATTN = "Module.attn.Attention.forward.0"


def _t(shape, producer=None):
    d = {"type": "tensor", "dtype": "float32", "shape": list(shape)}
    if producer is not None:
        d["producer"] = [producer, 0]
    return d


def _op(seq, name, reads=(), module=ATTN):
    op, _, phase = name.rsplit(".", 2)
    return complete({"seq": seq, "name": name, "op": op, "phase": phase, "kind": "api",
                     "module": module, "inputs": [_t((2, 2), p) for p in reads] or [_t((2, 2))],
                     "outputs": [_t((2, 2))]})


def _golden(fed: bool):
    """idx (dead) and mask (feeding the region's softmax, or nothing) run only on golden."""
    return [_op(0, "Torch.arange.0.forward", module="Module.Net.forward.0"),
            _op(1, "Tensor.__getitem__.0.forward", [0], module="Module.Net.forward.0"),
            _op(2, "Torch.where.0.forward", module="Module.Net.forward.0"),
            _op(3, "Torch.matmul.0.forward"),
            _op(4, "Functional.softmax.0.forward", [3, 2] if fed else [3])]


def _absorbed(fed: bool) -> list[int]:
    target = [_op(0, "Functional.scaled_dot_product_attention.0.forward")]
    golden = _golden(fed)
    pairs = [(None, 0), (None, 1), (None, 2), (0, None), (None, 3), (None, 4)]
    regions = [Region(0, "forward", [0], [3, 4], module=ATTN)]
    absorb(regions, pairs, target, golden, (True, True))
    return regions[0].golden


def test_an_op_nothing_reads_joins_the_region_its_run_joined():
    assert _absorbed(fed=True) == [0, 1, 2, 3, 4]


def test_without_a_run_mate_in_the_region_it_stays_unmatched():
    assert _absorbed(fed=False) == [3, 4]


def _module(name, outs, kwargs=None, parent="Module.Net.forward.0"):
    op, phase, _ = name.rsplit(".", 2)
    return complete({"seq": 9, "name": name, "op": op, "phase": phase, "kind": "module",
                     "module": parent, "inputs": [_t((2, 2))], "kwargs": kwargs or {},
                     "outputs": [_t((2, 2)) for _ in range(outs)]})


def test_a_one_sided_module_tensor_is_the_region_its_call_holds():
    t = [_op(0, "Functional.scaled_dot_product_attention.0.forward"), _module(ATTN, 1),
         _module("Module.fc.Linear.forward.0", 1)]
    g = [_op(0, "Torch.matmul.0.forward"), _module(ATTN, 2),
         _module("Module.fc.Linear.forward.0", 2)]
    region = Region(0, "forward", [0], [0], module=ATTN)
    covered = covered_tensors([region], [(0, 0), (1, 1), (2, 2)], t, g)
    assert covered == {1: {".output.1": region}}      # not fc's: it holds no region
