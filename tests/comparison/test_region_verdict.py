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


def _printed(divergence):
    import io

    from rich.console import Console

    from opdiff.comparison.result import CompareResult
    from opdiff.report.console import print_result

    out = io.StringIO()
    print_result(CompareResult("t", "g", [], divergence, {}), Console(file=out, width=400))
    return out.getvalue()


def _region_divergence(location, target_locations, golden_locations):
    from opdiff.comparison.result import Divergence

    return Divergence(name="Region.0.forward", op="Region", phase="forward",
                      reason="region in `attn` ...", location=location, metrics={},
                      origin="region", region={"target_ops": [], "golden_ops": [],
                                               "target_locations": target_locations,
                                               "golden_locations": golden_locations})


def test_the_console_prints_each_sides_lines_and_the_divergences_own_line(tmp_path):
    from opdiff.comparison.reasons import with_context
    from opdiff.store.schema import Location

    (tmp_path / "model.py").write_text("".join(f"code {n}\n" for n in range(1, 30)))
    golden = [{"file": "/elsewhere/model.py", "line": 20, "code": None},
              {"file": "/elsewhere/model.py", "line": 22, "code": None}]
    # a compiled kernel's line is the user's line it came from, not among its ops' lines
    fd = _region_divergence(Location("/src/user.py", 7, "y = f(x)"),
                            [{"file": "/torch/_inductor/k.py", "line": 3, "code": "kernel()"}],
                            golden)
    text = _printed(with_context(fd, source_root=tmp_path))
    lines = text.splitlines()
    assert "  target: /src/user.py:7  `y = f(x)`" in lines, text
    assert "  target: /torch/_inductor/k.py:3  `kernel()`" in lines, text
    assert "  golden: /elsewhere/model.py:20-22" in lines, text
    # golden's lines read under --source-root (the dump held no code for them)
    assert any(x.strip() == ">    20 | code 20" for x in lines), text
    assert any(x.strip() == "..." for x in lines), text      # 21 is no op's line
    # without a location at all
    assert "  golden: /elsewhere/model.py:20-22" in _printed(_region_divergence(None, [], golden))
