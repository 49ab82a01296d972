"""`--engine ray` on a real local Ray cluster (started and stopped here): the local engine's
result row for row, a worker killed mid-compare is retried, node-pinned dumps run on the node
that offers their resource, and without Ray the CLI says `pip install opdiff[ray]` (exit 2)."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray_cluster
from ray_cluster import killing_a_worker, one_line_exit_2, ray, ray_cli, same_result

import opdiff
from opdiff.comparison.engines import RayEngine

pytestmark = pytest.mark.slow
cluster = ray_cluster.cluster      # the shared fixture, by its name


def test_ray_gives_the_local_result_row_for_row(cluster, roots, local):
    same_result(opdiff.compare(str(roots[0]), str(roots[1]), engine=RayEngine()), local)


def test_a_mapping_file_reaches_every_ray_task(cluster, roots, local, tmp_path):
    """The parsed mapping goes to each pair task: Ray gives the local engine's result with the
    same mapping, and the mapping took effect (the ignored op's rows are gone; the faulty gelu
    is still named)."""
    mapping = tmp_path / "map.yaml"
    mapping.write_text("ignore:\n  - Functional.linear\n")
    mapped = opdiff.compare(str(roots[0]), str(roots[1]), mapping=mapping)
    assert not [r for r in mapped.rows if r.op_name.startswith("Functional.linear")]
    assert [r for r in local.rows if r.op_name.startswith("Functional.linear")]
    same_result(opdiff.compare(str(roots[0]), str(roots[1]), engine=RayEngine(),
                               mapping=mapping), mapped)


def test_the_old_ray_keywords_still_work_with_a_deprecation_warning(cluster, roots, local):
    # (which RayEngine they make: tests/comparison/test_engines.py)
    with pytest.warns(DeprecationWarning, match=r"pass engine=RayEngine\(address=, pins=\)"):
        old = opdiff.compare(str(roots[0]), str(roots[1]), engine="ray", ray_address="auto",
                             ray_pins={"/nowhere": "dumpZ"})     # no dump lies under /nowhere
    same_result(old, local)


def test_a_worker_killed_mid_compare_is_retried(cluster, roots, local):
    killing_a_worker(lambda: opdiff.compare(str(roots[0]), str(roots[1]), engine="ray"),
                     (b"ray::_remote", b"ray::_worker"), lambda again: same_result(again, local))


def test_without_ray_the_cli_says_how_to_get_it(roots):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from opdiff.cli import main\n"
            f"sys.exit(main(['compare', {str(roots[0])!r}, {str(roots[1])!r}, '--engine', 'ray',"
            " '--no-progress']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    one_line_exit_2(proc, "pip install opdiff[ray]")


def test_an_address_where_nothing_listens_is_one_line_at_once(roots):
    # (ray.init alone retries the GCS for minutes at such an address)
    with socket.socket() as free:               # a port nothing listens on: bound, then closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    start = time.monotonic()
    opdiff_bin = Path(sys.executable).with_name("opdiff")
    proc = subprocess.run([str(opdiff_bin), "compare", str(roots[0]), str(roots[1]),
                           "--engine", "ray", "--ray-address", f"127.0.0.1:{port}",
                           "--no-progress"], capture_output=True, text=True, timeout=120)
    one_line_exit_2(proc, f"cannot reach the Ray cluster at 127.0.0.1:{port}")
    assert time.monotonic() - start < 60


def test_two_nodes_dumps_pinned_to_the_second(roots, local, monkeypatch):
    # Two Ray "nodes" on this machine; the target dumps are said to live on the second one.
    # (Runs after the module's in-process cluster is shut down: it uses its own processes.)
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")    # a local test cluster, no token
    port = "6391"
    ray_cli("start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
             '--resources={"dumpA": 1}', "--disable-usage-stats")
    try:
        ray_cli("start", f"--address=127.0.0.1:{port}", "--num-cpus=1",
                 '--resources={"dumpB": 1}', "--disable-usage-stats")
        pinned = opdiff.compare(str(roots[0]), str(roots[1]), engine=RayEngine(
            address=f"127.0.0.1:{port}", pins={str(roots[0]): "dumpB"}))
        same_result(pinned, local)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        ray_cli("stop", "--force")
