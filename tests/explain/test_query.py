"""`opdiff query`: a parsed expression language over rows (never eval), streamed from rows.jsonl;
a malformed expression is one line and exit 2."""
from __future__ import annotations

import json
import math

import pytest

from opdiff.cli import main
from opdiff.comparison.result import TensorRow
from opdiff.explain.query import Query, QueryError
from opdiff.report.rows import iter_rows, write_rows


def row(i: int, **kw) -> TensorRow:
    base = dict(target_name=f"Functional.relu.{i}.forward.output.0", golden_name=None,
                op_name=f"Functional.relu.{i}.forward", role="output", phase="forward", kind="api",
                index=i, result="pass", module=f"Module.layers.{i % 3}.Block.forward.0",
                error=i * 1e-4, metrics={"Cosine": 1 - i * 1e-5, "One Thousandth Err Ratio": 0.5},
                step=0, rank=i % 2)
    base.update(kw)
    return TensorRow(**base)


@pytest.mark.parametrize("text, expected", [
    ('result == "pass"', 10),
    ('module ~ "layers\\.1" and error > 5e-4', 1),                  # i = 7 (1 and 4 are below)
    ('module ~ "layers\\\\.1"', 3),                                    # \\\\ is one backslash
    ('not (rank == 1) or index in [1, 3]', 7),
    ('rank == 0 and (index < 2 or index >= 8)', 2),
    ('metrics.Cosine < 0.999955', 5),
    ('metrics."One Thousandth Err Ratio" == 0.5', 10),
    ('metrics.NoSuchMetric > 0', 0),                                 # a missing value compares false
    ('golden_name == null', 10),
    ('golden_name != null', 0),
    ('name ~ "relu\\.9\\."', 1),
    ('error', 9),                                                    # a field alone: set and not 0
    ('module !~ "layers\\.[01]"', 3),
    ('error == "0.0001"', 0),                                        # text is never a number
])
def test_expressions(text, expected):
    rows = [row(i) for i in range(10)]
    assert sum(Query.parse(text).matches(r) for r in rows) == expected, text


def test_nan_compares_false_and_is_missing():
    r = row(1, error=math.nan)
    assert not Query.parse("error > 0").matches(r) and not Query.parse("error <= 0").matches(r)
    assert Query.parse("error == null").matches(r)


@pytest.mark.parametrize("text", ['', 'result ==', 'result = "x"', 'foo == 1', '(result == "x"',
                                  'name ~ "("', 'error > null', 'result == "x" and', 'error ~ 3',
                                  '__import__("os")', 'result == "x" ) ', "result == 'x"])
def test_malformed_expressions_are_refused_before_any_row(text):
    with pytest.raises(QueryError):
        Query.parse(text)


def test_the_command_streams_rows_and_filters(tmp_path, capsys):
    n = 30_000
    write_rows((row(i, result="error" if i % 1000 == 7 else "pass") for i in range(n)),
               tmp_path / "rows.jsonl")
    assert not isinstance(iter_rows(tmp_path / "rows.jsonl"), list)
    assert main(["query", str(tmp_path), 'result == "error"', "--count"]) == 0
    assert capsys.readouterr().out.strip() == str(n // 1000)
    assert main(["query", str(tmp_path / "rows.jsonl"), "--result", "error", "--rank", "1",
                 "--json", "--fields", "name,index,rank"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [d["index"] for d in lines] == [i for i in range(n) if i % 1000 == 7 and i % 2]
    assert set(lines[0]) == {"name", "index", "rank"}
    assert main(["query", str(tmp_path), "--module", "layers.2", "--limit", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[-1].startswith(f"... {n // 3 - 2} more")


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    write_rows([row(0)], tmp_path / "rows.jsonl")
    for argv in (["query", str(tmp_path), "result =="], ["query", str(tmp_path), "nofield > 1"],
                 ["query", str(tmp_path / "missing")], ["query", str(tmp_path), "--fields", "x"],
                 ["explain", str(tmp_path)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("opdiff: error: ") and err.count("\n") == 1, (argv, err)

