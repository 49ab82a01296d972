"""Every JSON document opdiff writes follows its schema in opdiff/schemas/, with real outputs of
every command; and the package has one strict-JSON encoder with one spelling of NaN and inf."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from opdiff import schemas
from opdiff.store.records import SCHEMA_VERSION, decode_float, json_text, strict_json

jsonschema = pytest.importorskip("jsonschema")


def strict_load(path: Path):
    """json.loads that refuses bare NaN/Infinity (what strict JSON readers do)."""
    def refuse(name):
        raise AssertionError(f"{path}: bare {name} is not strict JSON")
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def check(name: str, path: Path):
    doc = strict_load(path)
    schemas.validate(name, doc)
    return doc


@pytest.mark.parametrize("name", list(schemas.DOCUMENTS))
def test_every_schema_is_a_valid_schema_and_versions_its_document(name):
    schema = schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    if name not in ("next-dump", "dump-record"):     # an msprobe config; a line of a versioned file
        assert "schema_version" in schema["properties"]


def test_compare_outputs_of_the_demo(demo_outputs):
    out = demo_outputs["iadd"]
    summary = check("compare-summary", out / "summary.json")
    assert summary["schema_version"] == SCHEMA_VERSION
    assert summary["first_divergence"]["name"] == "Tensor.__iadd__.2.forward"
    lines = (out / "rows.jsonl").read_text(encoding="utf-8").splitlines()
    head = json.loads(lines[0])
    schemas.validate("rows", head)
    assert len(lines) > 100 and all(len(json.loads(line)) == len(head["fields"]) for line in lines[1:])


def test_dump_files_of_the_demo(demo_outputs):
    rank = demo_outputs["iadd"] / "dump" / "target" / "step0" / "rank0"
    meta = check("dump-meta", rank / "meta.json")
    assert meta["schema_version"] == SCHEMA_VERSION and meta["format_version"] == 1
    n = 0
    for line in (rank / "records.jsonl").read_text(encoding="utf-8").splitlines():
        schemas.validate("dump-record", json.loads(line))
        n += 1
    assert n > 50


def test_trend_outputs_of_the_demo(demo_outputs):
    out = demo_outputs["trend"]
    summary = check("trend-summary", out / "summary.json")
    assert summary["first_divergence"]["step"] == 30
    config = check("next-dump", out / "next_dump.json")
    assert config["step"] == [30]
    check("compare-summary", out / "compare" / "summary.json")
    metas = sorted((out / "mon").rglob("meta.json"))
    assert len(metas) == 2
    for meta in metas:
        check("monitor-meta", meta)


def test_overflow_outputs(demo_outputs, overflow_output):
    for path in (demo_outputs["fp16-overflow"] / "overflow.json", overflow_output / "overflow.json"):
        doc = check("overflow", path)
        assert doc["origin"]["name"] == "Torch.exp.0.forward"


def test_check_output(check_output):
    doc = check("check-summary", check_output / "summary.json")
    assert doc["failed"] >= 1 and doc["first_failure"]["name"] == "Tensor.__iadd__.2.forward"


def test_multi_rank_compare_output(ranks_output):
    doc = check("compare-summary", ranks_output / "summary.json")
    assert len(doc["pairs"]) == 6
    assert doc["first_divergence"]["rank"] == 2
    schemas.validate("rows", json.loads((ranks_output / "rows.jsonl").read_text().splitlines()[0]))


def test_onnx_outputs(onnx_output):
    check("compare-summary", onnx_output / "summary.json")
    details = check("onnx-details", onnx_output / "onnx_details.json")
    assert details["schema_version"] == SCHEMA_VERSION


def test_a_changed_document_fails_its_schema(demo_outputs):
    doc = strict_load(demo_outputs["iadd"] / "summary.json")
    del doc["counts"]
    with pytest.raises(jsonschema.ValidationError):
        schemas.validate("compare-summary", doc)
    doc = strict_load(demo_outputs["iadd"] / "summary.json")
    doc["first_divergence"]["location"]["line"] = "fifty-one"
    with pytest.raises(jsonschema.ValidationError):
        schemas.validate("compare-summary", doc)


def test_one_spelling_of_non_finite_numbers():
    text = json_text({"a": [math.nan, math.inf, -math.inf, 1.5], "t": (1, 2)})
    assert json.loads(text) == {"a": ["NaN", "Infinity", "-Infinity", 1.5], "t": [1, 2]}
    from opdiff.monitor.stream import json_safe
    assert json_safe({"x": math.inf, "y": object})["x"] == "Infinity"
    assert strict_json([math.nan]) == ["NaN"]


def test_readers_accept_the_old_spelling():
    for old, new in (("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity")):
        a, b = decode_float(old), decode_float(new)
        assert (math.isnan(a) and math.isnan(b)) or a == b
    assert decode_float("other text") == "other text"


def test_monitor_meta_of_an_old_stream_still_reads(tmp_path):
    from opdiff.monitor.stream import read_meta
    (tmp_path / "meta.json").write_text('{"format": "opdiff-monitor", "version": 1, "lr": "nan"}')
    assert read_meta(tmp_path)["lr"] == "nan"
