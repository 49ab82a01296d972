"""`schema.complete`: every record a stage is handed has its defaulted fields, filled once where
the dump is read (opdiff's reader, the msprobe and legacy adapters), never at each reader."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.store.adapters import discover
from opdiff.store.reader import open_dump
from opdiff.store.schema import Kind, Phase, complete

# The fields `Record` documents as always there once read, and their defaults.
DEFAULTS = {"seq": None, "kind": Kind.API, "phase": Phase.FORWARD, "module": None, "inputs": [],
            "outputs": [], "kwargs": {}, "parameters": {}, "stack": None}
MSPROBE = Path(__file__).resolve().parents[1] / "data" / "msprobe" / "statistics" / "golden"


def _is_complete(record: dict) -> bool:
    return all(k in record for k in (*DEFAULTS, "name", "op")) and \
        all(isinstance(record[k], list) for k in ("inputs", "outputs")) and \
        all(isinstance(record[k], dict) for k in ("kwargs", "parameters"))


def test_complete_fills_every_missing_field_with_its_documented_default():
    # a foreign record that names its call and nothing else
    record = {"name": "Functional.relu.0.forward"}
    assert complete(record) is record                      # in place
    assert record == {"name": "Functional.relu.0.forward", "op": "Functional.relu", **DEFAULTS}
    # the op is taken from the name; a name of no known form is its own op
    assert complete({"name": "Module.fc.Linear.parameters_grad.0"})["op"] == "Module.fc.Linear.parameters_grad"
    assert complete({"name": "/conv1/Conv"})["op"] == "/conv1/Conv"


def test_complete_keeps_what_is_present():
    inputs = [{"type": "int", "value": 2}]
    record = {"seq": 7, "name": "Module.fc.Linear.backward.0", "op": "Module.fc.Linear",
              "kind": Kind.MODULE, "phase": Phase.BACKWARD, "module": "Module.net.Net.backward.0",
              "inputs": inputs, "outputs": [], "kwargs": {"dim": {"type": "int", "value": 1}},
              "parameters": {"weight": {"type": "none"}}, "stack": 3, "forward": "Module.fc.Linear.forward.0"}
    before = json.loads(json.dumps(record))
    complete(record)
    assert record == before
    assert record["inputs"] is inputs
    assert complete(record) == before                      # idempotent


def test_null_containers_become_empty_and_each_record_gets_its_own():
    a = complete({"name": "a", "inputs": None, "outputs": None, "kwargs": None, "parameters": None})
    b = complete({"name": "b"})
    assert (a["inputs"], a["outputs"], a["kwargs"], a["parameters"]) == ([], [], {}, {})
    a["inputs"].append({"type": "none"})
    a["kwargs"]["x"] = {"type": "none"}
    assert b["inputs"] == [] and b["kwargs"] == {}         # no shared default container


def test_a_record_read_from_an_opdiff_dump_arrives_complete(tmp_path):
    with opdiff.dump(None, tmp_path / "d", level="L1", task="statistics"):
        torch.tanh(torch.randn(3, 4))
    path = tmp_path / "d" / "step0" / "rank0"
    raw = [json.loads(line) for line in (path / "records.jsonl").read_text().splitlines() if line.strip()]
    # capture leaves out what an op does not have: the reader is what makes the record whole
    assert any(not _is_complete(r) for r in raw)
    records = list(open_dump(path).records())
    assert [r["name"] for r in records] == [r["name"] for r in raw]
    assert all(_is_complete(r) for r in records)
    tanh = next(r for r in records if r["name"] == "Torch.tanh.0.forward")
    assert tanh["parameters"] == {} and tanh["kind"] == Kind.API and len(tanh["inputs"]) == 1


def test_a_record_read_from_an_msprobe_dump_arrives_complete():
    (dump,) = discover(MSPROBE)
    records = list(dump.records())
    assert records and all(_is_complete(r) for r in records)
    # a call msprobe wrote without keyword arguments, an API call without parameters
    raw = json.loads((MSPROBE / "step0" / "rank0" / "dump.json").read_text())["data"]
    conv = next(r for r in records if r["name"] == "Functional.conv2d.0.forward")
    assert not raw[conv["name"]]["input_kwargs"] and "parameters" not in raw[conv["name"]]
    assert conv["kwargs"] == {} and conv["parameters"] == {} and conv["kind"] == Kind.API
    assert {r["kind"] for r in records} >= {Kind.API, Kind.MODULE}


@pytest.mark.parametrize("name", ["ptdbg_v4", "npu_hooks"])
def test_records_of_the_legacy_formats_arrive_complete(name):
    (dump,) = discover(MSPROBE.parents[1] / "legacy" / name)
    records = list(dump.records())
    assert records and all(_is_complete(r) for r in records)


def test_the_stages_that_read_records_apply_no_default_of_their_own():
    """A default written again at a reader (`rec.get("kind", Kind.API)`, `rec.get("inputs") or
    []`) drifts from the one `complete` documents: the stages index a complete record."""
    import re

    src = Path(__file__).resolve().parents[2] / "src" / "opdiff"
    again = re.compile(r'\.get\("(kind|phase|module|stack|op|seq)", |'
                       r'\.get\("(inputs|outputs|kwargs|parameters)"\) or ')
    found = [f"{path.relative_to(src)}:{n}: {line.strip()}"
             for stage in ("comparison", "check", "overflow", "compat", "report")
             for path in sorted((src / stage).rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if again.search(line)]
    assert found == []
