"""The record-name grammar (store/schema.py): every name form parses, formats back, and splits."""
from __future__ import annotations

import pytest

from opdiff.store.schema import (Kind, Phase, RecordName, legacy_to_dotted, param_grad_links,
                                 record_name, split_tensor_name, tensor_name)


@pytest.mark.parametrize("name,op,phase,index,kind", [
    ("Functional.conv2d.0.forward", "Functional.conv2d", Phase.FORWARD, 0, Kind.API),
    ("Tensor.__iadd__.3.backward", "Tensor.__iadd__", Phase.BACKWARD, 3, Kind.API),
    ("Aten.add.Tensor.7.forward", "Aten.add.Tensor", Phase.FORWARD, 7, Kind.ATEN),
    ("Module.layer1.0.conv1.Conv2d.forward.0", "Module.layer1.0.conv1.Conv2d", Phase.FORWARD, 0,
     Kind.MODULE),
    ("Module.fc.Linear.backward.2", "Module.fc.Linear", Phase.BACKWARD, 2, Kind.MODULE),
    ("Cell.dense.Dense.forward.1", "Cell.dense.Dense", Phase.FORWARD, 1, Kind.MODULE),
    ("Module.fc.Linear.parameters_grad.0", "Module.fc.Linear", Phase.BACKWARD, 0, Kind.PARAM_GRAD),
    ("Tensor___iadd___4_forward", "Tensor.__iadd__", Phase.FORWARD, 4, Kind.API),
])
def test_every_name_form_parses(name, op, phase, index, kind):
    parsed = RecordName.parse(name)
    assert (parsed.op, parsed.phase, parsed.index, parsed.kind) == (op, phase, index, kind)
    if "_" not in name.split(".")[0]:           # dotted forms format back to themselves
        assert parsed.text == name == record_name(op, phase, index, kind)


def test_record_op_keeps_the_parameters_grad_word():
    assert RecordName.parse("Module.fc.Linear.parameters_grad.0").record_op == \
        "Module.fc.Linear.parameters_grad"
    assert RecordName.parse("Functional.relu.0.forward").record_op == "Functional.relu"


def test_names_of_no_known_form():
    assert RecordName.parse("conv1") is None
    assert legacy_to_dotted("Functional.relu.0.forward") == "Functional.relu.0.forward"
    assert legacy_to_dotted("Tensor___iadd___forward") == "Tensor.__iadd__.forward"


@pytest.mark.parametrize("name,split", [
    ("Functional.conv2d.0.forward.input.0", ("Functional.conv2d.0.forward", "input", "0")),
    ("Module.fc.Linear.forward.0.parameters.weight",
     ("Module.fc.Linear.forward.0", "parameters", "weight")),
    ("Module.fc.Linear.parameters_grad.0.weight",
     ("Module.fc.Linear.parameters_grad.0", "parameters", "weight")),
    # A module path with a part named like a role (BERT's `layer.0.output.dense`) stays whole.
    ("Module.bert.encoder.layer.0.output.dense.Linear.forward.0.input.0",
     ("Module.bert.encoder.layer.0.output.dense.Linear.forward.0", "input", "0")),
    ("/conv1/Conv.output.0", ("/conv1/Conv", "output", "0")),           # an ONNX node
    ("Functional.conv2d.0.forward", ("Functional.conv2d.0.forward", None, None)),
])
def test_tensor_names_split_into_record_role_and_slot(name, split):
    assert split_tensor_name(name) == split
    record, role, slot = split
    if role is not None:
        assert tensor_name(record, role, slot) == name


def test_param_grad_links_to_its_module_calls():
    assert param_grad_links("Module.fc.Linear.parameters_grad.1") == [
        "Module.fc.Linear.forward.1", "Module.fc.Linear.backward.1"]
    assert param_grad_links("Functional.relu.0.forward") == []


def test_the_reader_names_tensors_as_the_schema_does():
    from opdiff.store.records import iter_leaves

    t = {"type": "tensor", "dtype": "float32", "shape": [1]}
    records = [
        {"name": "Functional.linear.0.forward", "kind": Kind.API, "inputs": [t, {"type": "list", "items": [t]}],
         "kwargs": {"bias": t}, "outputs": [t]},
        {"name": "Module.fc.Linear.forward.0", "kind": Kind.MODULE, "parameters": {"weight": t}},
        {"name": "Module.fc.Linear.parameters_grad.0", "kind": Kind.PARAM_GRAD,
         "parameters": {"weight": t}},
    ]
    for record in records:
        for name, role, _ in iter_leaves(record):
            rec, split_role, slot = split_tensor_name(name)
            assert (rec, split_role) == (record["name"], role)
            assert tensor_name(rec, role, slot) == name
