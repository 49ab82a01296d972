"""report.html: what the file holds, and that it is safe against hostile dumps (the page in a
real browser: test_html_browser.py)."""
from __future__ import annotations

import json
import os
import random
import re

import pytest

from opdiff.comparison.result import CompareResult, TensorRow
from opdiff.errors import OpdiffError
from opdiff.report.html import json_for_script, render_html, report_script, write_html
from opdiff.report.payload import build_payload

EVIL = "<img src=x onerror=alert(1)></script><script>window.__pwned=1</script>\u2028&amp;%%SCRIPT%%"


def embedded_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="opdiff-data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


def records(data: dict, kind: str) -> list[dict]:
    """The payload's rows, ops or tree nodes as dicts, by the field names it ships (fields left
    off the end of a short row read None, as the page's script reads them)."""
    names = data["fields"][kind]
    return [dict(zip(names, list(values) + [None] * (len(names) - len(values)))) for values in data[kind]]


# ------------------------------------------------------------------------------ the file itself

def test_payload_holds_every_row_and_names_decode(cnn_result, tmp_path):
    result = cnn_result()
    path = write_html(result, tmp_path / "report.html")
    data = embedded_data(path.read_text(encoding="utf-8"))
    assert len(data["rows"]) == len(result.rows)
    S, ops = data["strings"], records(data, "ops")
    for packed, row in zip(records(data, "rows"), result.rows):
        op_name = S[ops[packed["op"]]["name"]]
        assert op_name == row.op_name
        t = packed["target_name"]
        name = None if t is None else t if isinstance(t, str) else f"{op_name}.{t[0]}"
        assert name == row.target_name
        assert S[packed["result"]] == row.result
        assert ops[packed["op"]]["index"] == row.index
        assert packed["error"] == (None if row.error is None else pytest.approx(row.error, rel=1e-4))
    # the culprit's rows are listed, and the tree marks its module
    culprit = [i for i, r in enumerate(result.rows) if r.op_name == result.first_divergence.name]
    assert data["divergence"]["rows"] == culprit
    marked = [n for n in records(data, "tree") if n["culprit"] == 2]
    assert len(marked) == 1 and S[marked[0]["label"]] == "conv2" and S[marked[0]["class"]] == "Conv2d"
    # the root's counts add up to every row that sits in a module
    root = records(data, "tree")[0]
    in_modules = sum(1 for r in result.rows if r.module or r.kind in ("module", "param_grad"))
    assert sum(root[k] for k in ("pass", "warning", "error", "unmatched")) == in_modules


def test_the_script_reads_fields_by_name():
    script = report_script()
    assert not re.search(r"\b(ROWS\[r\]|OPS\[[^\]]+\]|TREE\[[^\]]+\]|\bn)\[\d+\]", script)
    assert "D.fields.rows" in script


def test_module_tree_rolls_worst_verdict_up_to_ancestors(cnn_result):
    result = cnn_result()
    data = build_payload(result)
    S, tree = data["strings"], records(data, "tree")

    def module_path(r):   # `Module.layer1.0.conv1.Conv2d.forward.0` -> layer1.0.conv1
        name = r.op_name if r.kind in ("module", "param_grad") else r.module
        return ".".join(name.split(".")[1:-3]) if name else None

    def worst(results):
        return 3 if "error" in results else 2 if "warning" in results else 1 if "unmatched" in results else 0

    paths = {}
    for i, n in enumerate(tree):
        parts, p = [], i
        while tree[p]["parent"] >= 0:
            parts.insert(0, S[tree[p]["label"]])
            p = tree[p]["parent"]
        paths[".".join(parts)] = n
    assert {"conv1", "layer1", "layer1.0", "layer2.0.downsample.1", "fc"} <= set(paths)
    for path, node in paths.items():
        mine = [r.result for r in result.rows
                if module_path(r) is not None and (not path or module_path(r) == path
                                                   or module_path(r).startswith(path + "."))]
        assert [node[k] for k in ("pass", "warning", "error", "unmatched")] == \
            [mine.count(k) for k in ("pass", "warning", "error", "unmatched")], path
        assert node["severity"] == worst(mine), path
        for phase in ("forward", "backward"):
            of_phase = [r.result for r in result.rows if r.phase == phase and module_path(r) is not None
                        and (not path or module_path(r) == path or module_path(r).startswith(path + "."))]
            assert node[phase] == (worst(of_phase) if of_phase else -1), (path, phase)
    # the modules that ran before the culprit agree in forward; their gradients do not
    assert paths["conv1"]["forward"] == 0 and paths["conv1"]["backward"] == 3
    assert paths["layer2.0.conv2"]["forward"] == 3
    assert paths["layer2.0.conv2"]["culprit"] == 2 and paths["layer2.0"]["culprit"] == 1
    assert paths["layer2"]["culprit"] == 1
    assert paths["layer1"]["culprit"] == 0
    for i, n in enumerate(tree):       # pre-order: a node's subtree ends after its children
        assert i < n["end"] <= len(tree)
        if n["parent"] >= 0:
            assert n["parent"] < i and n["end"] <= tree[n["parent"]]["end"]


def test_a_very_deep_module_path_does_not_break_the_tree():
    deep = "Module." + ".".join(f"m{i}" for i in range(3000)) + ".Linear.forward.0"
    row = TensorRow(target_name="Functional.linear.0.forward.output.0", golden_name=None,
                    op_name="Functional.linear.0.forward", role="output", phase="forward", kind="api",
                    index=0, result="pass", module=deep)
    data = build_payload(CompareResult(target="a", golden="b", rows=[row], first_divergence=None, counts={}))
    tree = records(data, "tree")
    assert len(tree) == 3001                         # the root and one node per level
    assert tree[-1]["pass"] == 1 and tree[0]["pass"] == 1
    assert records(data, "ops")[0]["node"] == 3000   # the row sits in the innermost module


def test_numbers_are_strict_json_and_non_finite_survive(tmp_path):
    row = TensorRow(target_name="Torch.log.0.forward.output.0", golden_name="Torch.log.0.forward.output.0",
                    op_name="Torch.log.0.forward", role="output", phase="forward", kind="api", index=0,
                    metrics={"Cosine": float("nan"), "MaxAbsErr": float("inf"), "RMSE": 0.123456789123},
                    target_stats={"max": float("-inf"), "nan": 3}, result="error")
    result = CompareResult(target="a", golden="b", rows=[row], first_divergence=None, counts={"error": 1})
    page = render_html(result)
    data = embedded_data(page)          # json.loads with strict defaults: no bare NaN
    row = records(data, "rows")[0]
    metrics = dict(zip(data["metrics"], row["metrics"]))
    assert metrics["Cosine"] == "NaN" and metrics["MaxAbsErr"] == "Infinity"
    assert metrics["RMSE"] == 0.12346
    assert row["target_stats"][:1] == ["-Infinity"]


def test_numbers_are_rounded_short_but_close(tmp_path):
    rng = random.Random(3)
    values = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-12, 12) for _ in range(600)] + [0.0, 1.0, -2.5]
    rows = [TensorRow(target_name=f"Torch.exp.{i}.forward.output.0", golden_name=None,
                      op_name=f"Torch.exp.{i}.forward", role="output", phase="forward", kind="api", index=i,
                      metrics={"MaxAbsErr": v, "RMSE": None}) for i, v in enumerate(values)]
    page = render_html(CompareResult(target="a", golden="b", rows=rows, first_divergence=None, counts={}))
    data = embedded_data(page)
    assert data["metrics"] == ["MaxAbsErr"]          # RMSE is None everywhere: no column
    for v, packed in zip(values, records(data, "rows")):
        shown = packed["metrics"][0]
        assert shown == pytest.approx(v, rel=5e-5, abs=0)
        if abs(v) < 1e6:                             # Python writes big floats in full
            assert len(json.dumps(shown)) <= 11, shown   # e.g. -1.2346e-07


def test_hostile_strings_cannot_leave_the_data_block(cnn_result):
    result = cnn_result(evil=EVIL)
    result.environment_diff.append({"key": EVIL, "target": EVIL, "golden": "</SCRIPT >"})
    page = render_html(result)
    assert "<img" not in page.lower()
    assert page.lower().count("<script") == 2       # the data block and the report script
    assert "\u2028" not in page
    assert "</script" not in embedded_data_text(page).lower()
    # ... and the text comes back exactly
    data = embedded_data(page)
    assert any(EVIL in s for s in data["strings"])
    assert data["environment_diff"][-1]["key"] == EVIL


def embedded_data_text(page: str) -> str:
    return re.search(r'id="opdiff-data">(.*?)</script>', page, re.S).group(1)


def test_json_for_script_escapes_markup_characters():
    text = json_for_script({"a": "</script><!-- & \u2028\u2029"})
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == {"a": "</script><!-- & \u2028\u2029"}


def test_write_html_into_a_directory_replaces_only_the_report(cnn_result, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("old report")
    (out / "notes.txt").write_text("keep me")
    path = write_html(cnn_result(), out)
    assert path == out / "report.html"
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.html"]   # no temp file left


def test_write_html_refuses_a_file_as_directory(cnn_result, tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("a user's file")
    with pytest.raises(OpdiffError, match="is a file"):
        write_html(cnn_result(), blocker / "report.html")
    assert blocker.read_text() == "a user's file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_write_html_unwritable_directory_is_a_user_error(cnn_result, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OpdiffError, match="writable|permissions"):
            write_html(cnn_result(), locked / "report.html")
    finally:
        locked.chmod(0o700)


def test_file_is_self_contained(cnn_result):
    page = render_html(cnn_result())
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "default-src 'none'" in page          # the page may not fetch anything
    assert not re.search(r"\bon[a-z]+\s*=", page.split('id="opdiff-data"')[0])   # no inline handlers


@pytest.mark.slow
def test_fifty_thousand_rows_stay_compact(fifty_k):
    result, path, cpu_seconds = fifty_k
    size = path.stat().st_size
    print(f"50k rows: {size / 1e6:.1f} MB ({size / len(result.rows):.0f} bytes a row), "
          f"written in {cpu_seconds:.2f} s of CPU")
    assert len(result.rows) == 50_000
    assert size < 14e6
    assert cpu_seconds < 10
