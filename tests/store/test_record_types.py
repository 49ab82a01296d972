"""The record types in store/schema.py are the one source of the record format: the JSON Schema
of a records.jsonl line is generated from them, and every key a real capture writes is typed
(a capture at every level and task, FX graphs, Inductor's kernels, overflow origins, all held
to the schema with no key beyond the typed ones)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff import schemas
from opdiff.store import record_schema
from opdiff.store.schema import INDUCTOR, Kind, Phase, Record, is_inductor

jsonschema = pytest.importorskip("jsonschema")
SRC = Path(__file__).resolve().parents[2] / "src" / "opdiff"


class _Net(torch.nn.Module):
    """A tiny model whose forward is the user's code (a compiled node's source line)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.fc2(self.drop(torch.nn.functional.gelu(self.norm(self.fc1(x)))) * 2)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return _Net()


def _dump(path: Path, level: str, task: str, backend=None) -> list[dict]:
    import torch._dynamo
    model = _model()
    run = torch.compile(model, backend=backend) if backend else model
    torch._dynamo.reset()
    x = torch.randn(4, 8, requires_grad=True)
    with opdiff.dump(model, str(path), level=level, task=task):
        run(x).square().mean().backward()
    return [json.loads(line) for f in sorted(path.rglob("records.jsonl"))
            for line in f.read_text().splitlines() if line]


def _validator():
    return jsonschema.Draft202012Validator(record_schema.json_schema(closed=True))


def _untyped(records: list[dict]) -> list[str]:
    """What of these records the closed schema (no key beyond the typed ones) refuses."""
    check = _validator()
    return sorted({f"{r['name']}: {e.message}" for r in records for e in check.iter_errors(r)})[:10]


def _keys(records: list[dict]) -> set[str]:
    return {k for r in records for k in r}


def test_the_schema_file_is_generated_from_the_types():
    """schemas/dump-record.schema.json is what the types say (regenerate it with
    `python -m opdiff.store.record_schema --write`)."""
    assert schemas.load("dump-record") == record_schema.json_schema()
    assert record_schema.SCHEMA_FILE.read_text(encoding="utf-8") == record_schema.schema_text()


def test_the_types_spell_the_kinds_phases_and_compiled_facts():
    props = record_schema.json_schema()["properties"]
    assert props["kind"]["enum"] == list(Kind.ALL)
    assert props["phase"]["enum"] == list(Phase.ALL)
    assert record_schema.json_schema()["required"] == ["name", "op", "kind", "phase"]
    compiled = record_schema.json_schema()["$defs"]["compiled_facts"]["properties"]
    assert {"graph", "node", "backend", "module", "modules", "seq_nr", "source",
            "from_parameters"} <= set(compiled)
    assert all(p.get("description") for p in props.values())
    # (the docs page lists the compiled facts too: generated from the same types)
    rows = [name for name, _, _ in record_schema.fields(record_schema.schema.CompiledFacts)]
    assert rows == list(compiled)
    assert list(Record.__annotations__) == list(props)


def test_a_key_without_a_type_is_refused():
    """The check below can fail: an untyped key, a wrong type in a typed one."""
    record = {"name": "Functional.relu.0.forward", "op": "Functional.relu", "kind": "api",
              "phase": "forward", "inputs": [{"type": "tensor", "stats": {"max": 1.0}}]}
    assert _untyped([record]) == []
    assert _untyped([{**record, "surprise": 1}])
    assert _untyped([{**record, "inputs": [{"type": "tensor", "stats": {"max": 1.0, "fp8": 3}}]}])
    assert _untyped([{**record, "compiled": {"backend": "inductor", "kernel_line": 3}}])
    assert _untyped([{**record, "compiled": {"seq_nr": "3"}}])


def test_a_programs_list_argument_may_hold_references():
    """A kernel's program step reading a list of its inputs (`cat`): references nest in lists."""
    step = {"op": "Aten.cat", "kwargs": {}, "node": "cat",
            "args": [{"type": "list", "items": [{"ref": "input", "index": 0},
                                                {"ref": "step", "index": 1}]},
                     {"type": "int", "value": -1}]}
    record = {"name": "Inductor.cpp_fused_cat_0.0.forward", "op": "Inductor.cpp_fused_cat_0",
              "kind": "kernel", "phase": "forward",
              "program": {"steps": [step], "outputs": [{"output": 0, "value": {"ref": "step", "index": 0}}]}}
    assert _untyped([record]) == []
    schemas.validate("dump-record", record)
    step["args"][0]["items"].append({"ref": "elsewhere", "index": 0})
    assert _untyped([record])


@pytest.mark.parametrize("level", ["L0", "L1", "L2", "mix"])
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_every_key_capture_writes_is_typed(tmp_path, level, task):
    records = _dump(tmp_path, level, task)
    assert records and _untyped(records) == []
    if level in ("L2", "mix"):
        assert "autograd_node" in _keys(records) or level == "mix"


def test_an_fx_graphs_compiled_facts_are_typed(tmp_path):
    records = _dump(tmp_path, "L2", "statistics", backend="aot_eager")
    facts = {k for r in records for k in r.get("compiled") or {}}
    assert {"graph", "node", "module", "seq_nr", "source"} <= facts
    assert "autograd_node" in _keys(records)
    assert _untyped(records) == []
    assert not any(is_inductor(r) for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("level,task", [("mix", "statistics"), ("L2", "tensor")])
def test_inductors_kernels_are_typed(tmp_path, level, task):
    """Inductor at mix (extern kernels and its own, with the modules each call computes) and at
    L2 with tensors (each kernel's program)."""
    records = _dump(tmp_path, level, task, backend="inductor")
    kernels = [r for r in records if r["kind"] == Kind.KERNEL]
    assert kernels and all(is_inductor(r) for r in kernels)
    assert any((r.get("compiled") or {}).get("modules") for r in kernels)
    if task == "tensor":
        assert all("program" in r for r in kernels)
    assert _untyped(records) == []


def test_overflow_origins_are_typed(tmp_path):
    """An origin written by task="overflow_check": `overflow` and an in-place op's `note`."""
    path = tmp_path / "overflow"
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="overflow_check", level="L1",
                                   overflow_nums=-1)
    model = torch.nn.Linear(4, 4)
    dbg.start(model)
    model(torch.full((2, 4), 1.0)).sum()
    torch.full((4,), 100.0).exp_()
    dbg.stop()
    dbg.step()
    records = [json.loads(line) for f in sorted(path.rglob("records.jsonl"))
               for line in f.read_text().splitlines() if line]
    assert {"overflow", "note"} <= _keys(records), records
    assert _untyped(records) == []


def test_one_predicate_says_a_record_is_inductors():
    assert is_inductor({"compiled": {"backend": INDUCTOR, "graph": "c.py"}})
    assert not is_inductor({"compiled": {"graph": "<eval_with_key>.1"}})
    assert not is_inductor({"compiled": None}) and not is_inductor({})
    # nothing else spells it: no other module compares a backend with Inductor's name
    spelled = re.compile(r"""["']backend["']\)?\s*(==|!=)|==\s*["']inductor["']""")
    found = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if p.name != "schema.py"
             and "bisect" not in p.parts
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if spelled.search(line)]
    assert found == []
