"""Per-shard tasks (`RayEngine(shard_mb=...)`): a step/rank pair's tensor measurements cut into several Ray
tasks, each reading the dumps by path and returning only scores, merged before the pair's
alignment, verdicts and blame; on a real local Ray cluster the result is the local engine's,
row for row, the shards really run as tasks (Ray's timeline), and a shard whose worker is
killed is retried."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
import ray_cluster
from ray_cluster import killing_a_worker, ray, same_result

import opdiff
from opdiff.comparison.engines import RayEngine
from opdiff.comparison.shards import cut, measure_shard, merged, plan, tensor_pairs
from opdiff.store.adapters import discover

pytestmark = pytest.mark.slow
cluster = ray_cluster.cluster      # the shared fixture, by its name

SHARD_MB = 0.001           # 1 KiB: each of the test dumps' pairs (~5 KiB of tensors) in several


def _same(a, b) -> None:
    same_result(a, b)
    assert a.first_divergence.op == "Functional.gelu"


def _pair(roots, step=0, rank=0) -> tuple[str, str]:
    return tuple(str(r / f"step{step}" / f"rank{rank}") for r in roots)   # type: ignore[return-value]


def test_a_plan_covers_every_measured_tensor_pair_once(roots):
    t_path, g_path = _pair(roots)
    t, g = discover(t_path)[0], discover(g_path)[0]
    pairs = tensor_pairs(list(t.records()), list(g.records()))
    keys = [p for p, _ in pairs]
    assert len(keys) == len(set(keys)) > 10
    groups = plan(t_path, g_path, int(SHARD_MB * 2**20))
    assert len(groups) > 2 and [k for group in groups for k in group] == keys
    assert plan(t_path, g_path, 2**30) == []            # it fits in the pair's own task
    assert cut(pairs, 1) == [[k] for k in keys]         # a group holds at least one pair


def test_shard_scores_are_the_pairs_own_measurements(roots):
    t_path, g_path = _pair(roots)
    from opdiff.comparison.pair import compare_pair

    groups = plan(t_path, g_path, int(SHARD_MB * 2**20))
    scores = merged(measure_shard(t_path, g_path, group) for group in groups)
    t, g = discover(t_path)[0], discover(g_path)[0]
    with_shards = compare_pair(t, g, measured=scores)
    without = compare_pair(t, g)
    assert with_shards.rows == without.rows
    assert with_shards.first_divergence == without.first_divergence is not None
    # the scores are really used: a planted measurement shows in its pair's rows
    key, m = next(iter(scores.items()))
    planted = replace(m, metrics={**m.metrics, "MaxAbsErr": 12345.0})
    rows = compare_pair(t, g, measured={**scores, key: planted}).rows
    assert any(r.metrics.get("MaxAbsErr") == 12345.0 for r in rows)
    assert not any(r.metrics.get("MaxAbsErr") == 12345.0 for r in without.rows)


def _shard_tasks() -> int:
    time.sleep(1.5)            # task events reach the GCS after a short delay
    return sum(1 for e in ray.timeline() if str(e.get("name", "")).endswith("measure_shard"))


def test_sharded_ray_compare_is_the_local_result_row_for_row(cluster, roots, local):
    before = _shard_tasks()
    sharded = opdiff.compare(str(roots[0]), str(roots[1]), engine=RayEngine(shard_mb=SHARD_MB))
    _same(sharded, local)
    t_path, g_path = _pair(roots)
    per_pair = len(plan(t_path, g_path, int(SHARD_MB * 2**20)))
    assert _shard_tasks() - before >= 4 * per_pair       # 4 pairs (2 steps x 2 ranks), sharded


def test_a_shard_worker_killed_mid_compare_is_retried(cluster, roots, local):
    killing_a_worker(lambda: opdiff.compare(str(roots[0]), str(roots[1]),
                                            engine=RayEngine(shard_mb=SHARD_MB)),
                     (b"ray::measure_shard",), lambda again: _same(again, local), attempts=6)


@pytest.mark.parametrize("value", [0, -1.0, True, "4", float("inf")])
def test_a_bad_shard_size_is_refused(roots, value):
    with pytest.raises(opdiff.OpdiffError, match="shard_mb must be a positive number"):
        RayEngine(shard_mb=value)
    with pytest.raises(opdiff.OpdiffError, match="shard_mb must be a positive number"), \
            pytest.warns(DeprecationWarning):      # the old keyword: checked alike
        opdiff.compare(str(roots[0]), str(roots[1]), engine="ray", ray_shard_mb=value)


def test_shard_mb_without_the_ray_engine_is_one_line_exit_2(roots, capsys):
    from opdiff.cli import main

    assert main(["compare", str(roots[0]), str(roots[1]), "--shard-mb", "4"]) == 2
    err = capsys.readouterr().err
    assert "--shard-mb is for --engine ray" in err and len(err.strip().splitlines()) == 1
    assert main(["compare", str(roots[0]), str(roots[1]), "--engine", "ray",
                 "--shard-mb", "lots"]) == 2
    assert "--shard-mb expects a size in MiB" in capsys.readouterr().err
