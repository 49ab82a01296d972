"""Which outputs of an Inductor kernel are computed from parameters alone (autocast's weight
casts fused into another module's kernel): `kernel_programs.inputs_of_outputs` on a bound
program and `inductor.from_parameters` on the record's inputs, without compiling anything."""
from __future__ import annotations

from opdiff.capture.inductor import from_parameters
from opdiff.capture.kernel_programs import inputs_of_outputs

WEIGHT = {"type": "tensor", "leaf": "parameter", "fqn": "model.layers.0.mlp.gate_proj.weight"}
RESIDUAL = {"type": "tensor", "producer": [3, 0]}
BF16 = {"type": "dtype", "value": "torch.bfloat16"}


def _program() -> dict:
    # step 0: the weight cast to bf16 (output 0); step 1: the residual times itself (output 1);
    # step 2: a random draw on the weight (output 2); step 3: weight plus residual (output 3)
    step = {"kwargs": {}}
    return {"steps": [
        {**step, "op": "Aten._to_copy", "args": [{"ref": "input", "index": 0}],
         "kwargs": {"dtype": BF16}},
        {**step, "op": "Aten.mul", "args": [{"ref": "input", "index": 1},
                                                  {"ref": "input", "index": 1}]},
        {**step, "op": "Aten.bernoulli", "args": [{"ref": "input", "index": 0},
                                                   {"type": "float", "value": 0.5}]},
        {**step, "op": "Aten.add", "args": [{"ref": "step", "index": 0},
                                                  {"ref": "input", "index": 1}]}],
        "outputs": [{"output": i, "value": {"ref": "step", "index": i}} for i in range(4)]}


def test_each_output_knows_the_inputs_it_is_computed_from():
    found = inputs_of_outputs(_program())
    assert found == {0: {0}, 1: {1}, 3: {0, 1}}     # (the random draw's output: left out)


def test_only_outputs_from_parameters_alone_are_listed_with_their_names():
    made = from_parameters(inputs_of_outputs(_program()), [WEIGHT, RESIDUAL])
    assert made == [[0, ["model.layers.0.mlp.gate_proj.weight"]]]
    # an input that is not a parameter or buffer (or not described) lists nothing
    assert from_parameters({0: {0}}, [RESIDUAL]) == []
    assert from_parameters({0: {5}}, [WEIGHT]) == []
    assert from_parameters({0: set()}, [WEIGHT]) == []      # (constants only: no parameter)
