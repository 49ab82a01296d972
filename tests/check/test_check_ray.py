"""`opdiff check --engine ray` on a real local Ray cluster (started and stopped here): the local
engine's result row for row (CSV and summary), a worker killed mid-check is retried, and bad
input (no Ray, an address where nothing listens, a malformed one) is one line and exit 2."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkmodels import dump

from opdiff.check import check_dump
from opdiff.check.outputs import csv_rows
from opdiff.cli import main
from opdiff.comparison.ray_engine import EngineError, reachable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import ray_cluster  # noqa: E402
from ray_cluster import killing_a_worker, one_line_exit_2  # noqa: E402

pytestmark = pytest.mark.slow
cluster = ray_cluster.cluster      # the shared fixture, by its name

FAULT = dict(op="Functional.conv2d", call=2, phase="forward", scale=1.001)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    return dump("cnn", tmp_path_factory.mktemp("faulty") / "d", fault=FAULT)


@pytest.fixture(scope="module")
def local(faulty):
    return check_dump(faulty)


def _untimed(result) -> list[dict]:
    return [{k: v for k, v in op.to_dict().items() if k != "seconds"} for op in result.ops]


def _same(a, b) -> None:
    assert len(a.ops) > 10 and _untimed(a) == _untimed(b)
    assert csv_rows(a) == csv_rows(b)
    assert a.first_failure.name == b.first_failure.name == "Functional.conv2d.2.forward"


def test_ray_gives_the_local_result_row_for_row(cluster, faulty, local):
    _same(check_dump(faulty, engine="ray"), local)


def test_cli_ray_writes_the_local_csv_and_summary(cluster, faulty, tmp_path, capsys):
    outs = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        assert main(["check", str(faulty), "-o", str(out), "--engine", engine,
                     "--no-progress"]) == 0
        outs[engine] = out
    assert "Functional.conv2d.2.forward" in capsys.readouterr().out
    rows = {e: list(csv.reader(open(next(o.glob("check_result_*.csv"))))) for e, o in outs.items()}
    assert rows["ray"] == rows["local"] and len(rows["ray"]) > 10
    summaries = {e: json.loads((o / "summary.json").read_text()) for e, o in outs.items()}
    for s in summaries.values():
        s.pop("seconds"), s.pop("files")
    assert summaries["ray"] == summaries["local"] and summaries["ray"]["failed"] == 1
    progress = (outs["ray"] / "check_progress.jsonl").read_text().splitlines()
    names = [json.loads(line)["name"] for line in progress]     # one line per op, each once
    assert len(names) == len(set(names)) and set(names) == {r[1] for r in rows["local"][1:]}


def test_a_worker_killed_mid_check_is_retried(cluster, faulty, local):
    killing_a_worker(lambda: check_dump(faulty, engine="ray"), (b"ray::check_batch",),
                     lambda again: _same(again, local))


def _cli(args: list[str], prelude: str = "") -> subprocess.CompletedProcess:
    code = (f"import sys\n{prelude}\nfrom opdiff.cli import main\n"
            f"sys.exit(main({args!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180)


def test_without_ray_the_cli_says_how_to_get_it(faulty):
    proc = _cli(["check", str(faulty), "--engine", "ray", "--no-progress"],
                prelude="sys.modules['ray'] = None")
    one_line_exit_2(proc, "pip install opdiff[ray]")


def test_bad_ray_address_isone_line_exit_2(faulty):
    start = time.perf_counter()
    proc = _cli(["check", str(faulty), "--engine", "ray", "--ray-address", "127.0.0.1:1",
                 "--no-progress"])
    one_line_exit_2(proc, "cannot reach the Ray cluster at 127.0.0.1:1")
    assert time.perf_counter() - start < 60      # Ray alone would wait for minutes


@pytest.mark.parametrize("address,words", [
    ("ray://127.0.0.1:1", "cannot reach the Ray cluster"),
    ("no-port-here", "expected auto, HOST:PORT"),
    ("127.0.0.1:notaport", "expected auto, HOST:PORT"),
])
def test_reachable_refuses_what_nothing_listens_on(address, words):
    with pytest.raises(EngineError, match=words):
        reachable(address)
    reachable(None), reachable("auto")         # Ray's own: a local cluster, the running one


def test_ray_address_without_the_ray_engine_is_refused(faulty, capsys):
    assert main(["check", str(faulty), "--ray-address", "auto"]) == 2
    assert "--engine ray" in capsys.readouterr().err
    assert main(["check", str(faulty), "--engine", "ray", "--jobs", "4"]) == 2
    err = capsys.readouterr().err
    assert "--jobs is for --engine local" in err and len(err.strip().splitlines()) == 1
