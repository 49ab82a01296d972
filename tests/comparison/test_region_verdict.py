"""A region's verdict in words: its inputs named by the arguments its ops read them as (looked up
without running anything a dump names), and each side's source lines."""
from __future__ import annotations

import sys

import pytest

from opdiff.comparison.arguments import argument_name, positional_names
from opdiff.comparison.region_verdict import input_words, side_locations, spans

SDPA = "Functional.scaled_dot_product_attention"


@pytest.mark.parametrize("op, key, name", [
    (SDPA, "0", "query"), (SDPA, "2", "value"), (SDPA, "attn_mask", "attn_mask"),
    ("Torch.matmul", "1", "other"),             # a builtin: its documented call
    ("Functional.softmax", "0", "input"),       # a Python function: its signature
    ("Torch.cat", "0.2", "tensors[2]"),         # a list argument's third tensor
    ("Tensor.transpose", "0", "self"),          # a Tensor method: self first
    ("Tensor.__mul__", "0", None),              # nothing says: the caller keeps input.0
    (SDPA, "9", None),                          # beyond the signature
])
def test_argument_names(op, key, name):
    assert argument_name(op, key) == name


@pytest.mark.parametrize("op", [
    "Torch.os", "Torch.__builtins__", "Torch.Tensor", "Functional.torch", "Torch.linalg.norm",
    "Torch.no_such_op", "Aten.mm", "Module.fc.Linear", "Functional._canonical_mask",
    "Tensor.__init_subclass__", "Torch._dynamo"])
def test_a_dumps_op_name_selects_no_module_class_or_private_name_and_imports_nothing(op):
    before = set(sys.modules)
    assert positional_names(op) == ()
    assert set(sys.modules) == before


def _inputs(*specs):
    return [{"tensor": f"t{i}", "name": n, "op": op, "agrees": ok}
            for i, (n, op, ok) in enumerate(specs)]


def test_input_words_group_by_reader_and_say_which_do_not_agree():
    agree = _inputs(("query", SDPA, True), ("key", SDPA, True), ("value", SDPA, True),
                    ("model.fc.weight", None, True))
    assert input_words(agree) == f"`query`, `key`, `value` of `{SDPA}`; `model.fc.weight`"
    some = _inputs(("query", SDPA, False), ("key", SDPA, True), ("value", SDPA, True))
    assert input_words(some) == (f"`query`, `key`, `value` of `{SDPA}`, of which `query` "
                                 f"exceeds its own tolerance")


def _op(op, file, line, module="Module.attn.Attention.forward.0", code=None):
    return {"name": f"{op}.0.forward", "op": op, "module": module,
            "location": {"file": file, "line": line, "code": code or f"line {line}"}}


def test_side_locations_are_the_regions_own_lines_once_each_by_file():
    ops = [_op("Torch.arange", "/m/masks.py", 500, module="Module.Model.forward.0"),
           _op("Torch.matmul", "/m/model.py", 193), _op("Tensor.expand", "/m/model.py", 176),
           _op("Tensor.reshape", "/m/model.py", 176), _op("Functional.softmax", "/m/other.py", 9),
           {"name": "x", "op": "Tensor.add", "module": "Module.attn.Attention.forward.0",
            "location": None}]
    located = side_locations(ops, "attn")
    assert [(x["file"], x["line"]) for x in located] == [
        ("/m/model.py", 176), ("/m/model.py", 193), ("/m/other.py", 9)]
    assert spans(located) == [("/m/model.py", 176, 193, [(176, "line 176"), (193, "line 193")]),
                              ("/m/other.py", 9, 9, [(9, "line 9")])]
    # nothing ran inside the module: every op's lines
    assert [x["line"] for x in side_locations(ops[:1], "attn")] == [500]
