"""`compare(engine=...)`: LocalEngine or RayEngine, each checking its own arguments when made;
the old Ray keywords (ray_address, ray_pins, ray_shard_mb) still work, with a DeprecationWarning;
bad combinations are one line (exit 2 from the CLI). The Ray runs themselves:
tests/distributed/test_ray_engine.py and test_ray_shards.py."""
from __future__ import annotations

import warnings

import pytest

import opdiff
from opdiff.cli import main
from opdiff.comparison.engines import LocalEngine, RayEngine, engine_for

from dumpkit import cnn_run


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    cnn_run(root / "target", faults=[("Functional.conv2d", 1, 1 + 1e-3)])
    cnn_run(root / "golden")
    return root / "target", root / "golden"


def test_an_engine_object_or_its_name_runs_the_compare(pair):
    by_object = opdiff.compare(*map(str, pair), engine=LocalEngine(), replay="off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the names are not deprecated
        by_name = opdiff.compare(*map(str, pair), engine="local", replay="off")
    assert by_object.first_divergence.name == by_name.first_divergence.name == \
        "Functional.conv2d.1.forward"
    assert by_object.rows == by_name.rows


def test_the_names_and_the_old_keywords_make_these_engines():
    assert engine_for("local") == LocalEngine() and engine_for("ray") == RayEngine()
    engine = RayEngine(address="auto")
    assert engine_for(engine) is engine
    with pytest.warns(DeprecationWarning, match=r"compare\(ray_address=, ray_shard_mb=\) is "
                                                r"deprecated.*RayEngine\(address=, shard_mb=\)"):
        old = engine_for("ray", ray_address="10.0.0.1:6379", ray_pins=None, ray_shard_mb=64)
    assert old == RayEngine(address="10.0.0.1:6379", shard_mb=64)
    with pytest.warns(DeprecationWarning):
        assert engine_for("ray", ray_pins={"/mnt/a": "dumpA"}).pins == {"/mnt/a": "dumpA"}


@pytest.mark.parametrize("kwargs, words", [
    ({"address": "no-port-here"}, "Ray address 'no-port-here': expected auto, HOST:PORT"),
    ({"address": 6379}, "Ray address 6379: expected auto"),
    ({"pins": ["/mnt/a"]}, "pins must be a mapping"),
    ({"pins": {"/mnt/a": ""}}, "is not a path prefix and the name of a Ray custom resource"),
    ({"pins": {"": "dumpA"}}, "is not a path prefix"),
    ({"shard_mb": 0}, "shard_mb must be a positive number of MiB"),
    ({"shard_mb": "4"}, "shard_mb must be a positive number of MiB"),
    ({"shard_mb": True}, "shard_mb must be a positive number of MiB"),
])
def test_the_ray_engine_checks_its_own_arguments(kwargs, words):
    with pytest.raises(opdiff.OpdiffError, match=words.replace("(", r"\(")) as err:
        RayEngine(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("engine, kwargs, words", [
    ("local", {"ray_address": "auto"}, "ray_address is for the Ray engine, not engine='local'"),
    ("local", {"ray_shard_mb": 4, "ray_pins": {"/a": "b"}}, "ray_pins and ray_shard_mb are for"),
    (RayEngine(), {"ray_address": "auto"}, "ray_address cannot be given with engine=RayEngine"),
    (LocalEngine(), {"ray_pins": {"/a": "b"}}, "ray_pins cannot be given with engine=LocalEngine"),
    ("dask", {}, "engine must be 'local', 'ray', LocalEngine() or RayEngine(...), not 'dask'"),
    (RayEngine, {}, "engine must be"),            # the class, not an engine
])
def test_bad_combinations_are_one_line_before_any_dump_is_read(tmp_path, engine, kwargs, words):
    missing = str(tmp_path / "no-such-dump")
    with pytest.raises(opdiff.OpdiffError) as err:
        opdiff.compare(missing, missing, engine=engine, **kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_mapping_file_with_ray_shards_is_refused(pair, tmp_path):
    # (a mapping with one task per pair runs: tests/distributed/test_ray_engine.py)
    mapping = tmp_path / "map.yaml"
    mapping.write_text("ignore:\n  - Functional.relu\n")
    with pytest.raises(opdiff.OpdiffError, match="cannot be combined with shard_mb"):
        opdiff.compare(*map(str, pair), engine=RayEngine(shard_mb=4), mapping=mapping)


@pytest.mark.parametrize("args, words", [
    (["--ray-address", "auto"], "--ray-address is for --engine ray"),
    (["--ray-pin", "/a=b", "--shard-mb", "4"], "--ray-pin and --shard-mb are for --engine ray"),
    (["--engine", "ray", "--ray-address", "nowhere"], "Ray address 'nowhere': expected auto"),
    (["--engine", "ray", "--ray-pin", "/a"], "--ray-pin expects PATH=RESOURCE"),
    (["--engine", "ray", "--shard-mb", "lots"], "--shard-mb expects a size in MiB"),
    (["--engine", "ray", "--shard-mb", "4", "--map", "MAP"], "cannot be combined with shard_mb"),
])
def test_the_cli_says_a_bad_combination_in_one_line_exit_2(pair, tmp_path, capsys, args, words):
    mapping = tmp_path / "map.yaml"
    mapping.write_text("ignore:\n  - Functional.relu\n")
    args = [str(mapping) if a == "MAP" else a for a in args]
    assert main(["compare", *map(str, pair), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
