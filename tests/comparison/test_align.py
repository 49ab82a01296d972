"""The alignment on synthetic records, table-driven: who meets whom, never by position."""
import pytest

from opdiff.comparison.align import align
from opdiff.store.schema import complete


def rec(name: str, shape=(2, 3), module=None) -> dict:
    """A record named msprobe's way (`Functional.relu.0.forward`) with one input and output."""
    op, index, phase = name.rsplit(".", 2)
    tensor = {"type": "tensor", "dtype": "float32", "shape": list(shape)}
    return complete({"name": name, "op": op, "phase": phase, "kind": "api", "module": module,
                     "inputs": [dict(tensor)], "outputs": [dict(tensor)]})


def seq(*names, shapes=None) -> list[dict]:
    shapes = shapes or {}
    return [rec(n, shapes.get(n, (2, 3))) for n in names]


CASES = [
    ("identical names pair one to one",
     seq("Functional.conv2d.0.forward", "Functional.relu.0.forward", "Functional.linear.0.forward"),
     seq("Functional.conv2d.0.forward", "Functional.relu.0.forward", "Functional.linear.0.forward"),
     False, [(0, 0), (1, 1), (2, 2)]),
    ("an extra op on the target: later ops still pair, by op, not by counter",
     seq("Functional.conv2d.0.forward", "Functional.relu.0.forward", "Functional.relu.1.forward",
         "Functional.linear.0.forward", "Functional.relu.2.forward"),
     seq("Functional.conv2d.0.forward", "Functional.relu.0.forward",
         "Functional.linear.0.forward", "Functional.relu.1.forward"),
     False, [(0, 0), (1, 1), (2, None), (3, 2), (4, 3)]),
    ("an extra op on the golden",
     seq("Functional.conv2d.0.forward", "Functional.linear.0.forward"),
     seq("Functional.conv2d.0.forward", "Tensor.float.0.forward", "Functional.linear.0.forward"),
     False, [(0, 0), (None, 1), (1, 2)]),
    ("a fused op: nobody to pair with on either side",
     seq("Torch.addmm.0.forward", "Functional.relu.0.forward"),
     seq("Functional.linear.0.forward", "Tensor.__add__.0.forward", "Functional.relu.0.forward"),
     False, [(0, None), (None, 0), (None, 1), (1, 2)]),
    ("changed shapes, same names: paired without shape_flag",
     seq("Functional.relu.0.forward", "Functional.linear.0.forward",
         shapes={"Functional.linear.0.forward": (4, 3)}),
     seq("Functional.relu.0.forward", "Functional.linear.0.forward"),
     False, [(0, 0), (1, 1)]),
    ("changed shapes, same names: unmatched with shape_flag",
     seq("Functional.relu.0.forward", "Functional.linear.0.forward",
         shapes={"Functional.linear.0.forward": (4, 3)}),
     seq("Functional.relu.0.forward", "Functional.linear.0.forward"),
     True, [(0, 0), (1, None), (None, 1)]),
    ("changed shapes behind an extra op: paired on op alone without shape_flag",
     seq("Tensor.float.0.forward", "Functional.relu.0.forward", "Functional.linear.0.forward",
         shapes={"Functional.linear.0.forward": (4, 3)}),
     seq("Functional.relu.0.forward", "Functional.linear.0.forward"),
     False, [(0, None), (1, 0), (2, 1)]),
    ("changed shapes behind an extra op: unmatched with shape_flag",
     seq("Tensor.float.0.forward", "Functional.relu.0.forward", "Functional.linear.0.forward",
         shapes={"Functional.linear.0.forward": (4, 3)}),
     seq("Functional.relu.0.forward", "Functional.linear.0.forward"),
     True, [(0, None), (1, 0), (2, None), (None, 1)]),
    ("different ops at the same positions are never paired by position",
     seq("Functional.gelu.0.forward", "Functional.softmax.0.forward"),
     seq("Functional.relu.0.forward", "Functional.sigmoid.0.forward"),
     False, [(0, None), (1, None), (None, 0), (None, 1)]),
]


@pytest.mark.parametrize("what, target, golden, shape_flag, pairs", CASES, ids=[c[0] for c in CASES])
def test_align(what, target, golden, shape_flag, pairs):
    got = align(target, golden, shape_flag=shape_flag)
    assert got == pairs
    # every record of both sides appears exactly once
    assert sorted(t for t, _ in got if t is not None) == list(range(len(target)))
    assert sorted(g for _, g in got if g is not None) == list(range(len(golden)))
    for t, g in got:
        if t is not None and g is not None:
            assert target[t]["op"] == golden[g]["op"]

