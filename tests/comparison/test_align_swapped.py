"""Swapped neighbours pair (autocast puts a module's parameters_grad record on the other side
of Functional.linear.N.backward in one run), by name and signature, never by position."""
import pytest

from opdiff.comparison.align import SWAP_WINDOW, align
from opdiff.store.schema import complete


def rec(name: str, shapes=((2, 3),), kind="api", module=None) -> dict:
    """A record named msprobe's way whose tensors have `shapes` (parameters_grad: parameters)."""
    op, _, phase = name.rsplit(".", 2)
    if kind == "param_grad":
        params = {k: {"type": "tensor", "dtype": "float32", "shape": list(s)}
                  for k, s in zip(("weight", "bias"), shapes)}
        return complete({"name": name, "op": op, "phase": phase, "kind": kind, "module": None,
                         "parameters": params})
    tensor = {"type": "tensor", "dtype": "float32", "shape": list(shapes[0])}
    return complete({"name": name, "op": op, "phase": phase, "kind": kind, "module": module,
                     "inputs": [dict(tensor)], "outputs": [dict(tensor)]})


LIN = rec("Functional.linear.3.backward")
PG = rec("Module.fc.Linear.parameters_grad.0.backward", ((4, 3), (4,)), kind="param_grad")
PG_BIAS_FIRST = dict(PG, parameters={"bias": PG["parameters"]["bias"],
                                     "weight": PG["parameters"]["weight"]})
RELU = rec("Functional.relu.0.backward")
GELU = rec("Functional.gelu.0.backward")
OTHER_PG = rec("Module.head.Linear.parameters_grad.0.backward", ((4, 3), (4,)),
               kind="param_grad")
FAR = [rec(f"Functional.add.{i}.backward") for i in range(SWAP_WINDOW + 2)]

CASES = [
    ("parameters_grad after the linear on one side, before it on the other",
     [RELU, LIN, PG, GELU], [RELU, PG, LIN, GELU], [(0, 0), (1, 2), (2, 1), (3, 3)]),
    ("... and its gradients listed in the other order",
     [RELU, LIN, PG, GELU], [RELU, PG_BIAS_FIRST, LIN, GELU], [(0, 0), (1, 2), (2, 1), (3, 3)]),
    ("a different record in the swapped place stays unmatched (names differ)",
     [RELU, LIN, PG, GELU], [RELU, OTHER_PG, LIN, GELU],
     [(0, 0), (1, 2), (2, None), (None, 1), (3, 3)]),
    ("same name, different shapes: not the same record",
     [RELU, LIN, PG, GELU],
     [RELU, rec(PG["name"], ((8, 3), (8,)), kind="param_grad"), LIN, GELU],
     [(0, 0), (1, 2), (2, None), (None, 1), (3, 3)]),
    ("too far apart to be neighbours: unmatched, never paired by position",
     [PG, *FAR, GELU], [*FAR, PG, GELU],
     [(0, None), *[(k + 1, k) for k in range(len(FAR))], (None, len(FAR)), (len(FAR) + 1,
                                                                             len(FAR) + 1)]),
]


@pytest.mark.parametrize("why,target,golden,expected", CASES, ids=[c[0] for c in CASES])
def test_swapped_neighbours(why, target, golden, expected):
    pairs = align(target, golden)
    assert sorted(pairs, key=str) == sorted(expected, key=str), why
    # every record once on each side
    assert sorted(t for t, _ in pairs if t is not None) == list(range(len(target)))
    assert sorted(g for _, g in pairs if g is not None) == list(range(len(golden)))
