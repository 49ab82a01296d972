"""`opdiff calibrate`: a per-tensor noise floor measured from two or more healthy runs.

    from opdiff.calibration import calibrate
    floor = calibrate(["dump/threads1", "dump/threads8", "dump/seed2"], "noise/")
    opdiff.compare("dump/target", "dump/threads1", noise="noise/")

Every two of the runs are compared (`opdiff.compare`, replay off: both are healthy) and each
tensor keeps the largest relative error and scale error any two showed
(`comparison.noise_floor.NoiseFloor`), written to NOISE/noise_floor.json
(`schemas/noise-floor.schema.json`). The runs should differ only as healthy runs do: other
thread counts, nondeterministic kernels, a device pair the user trusts, weights through a
checkpoint round trip; never another dtype (that is what compare judges). Three or more runs
measure a floor better than two: one pair is one sample of the noise.
"""
from __future__ import annotations

import os
from itertools import combinations
from typing import Sequence

from .comparison.noise_floor import FILE, NoiseFloor
from .errors import ConfigError

MIN_RUNS = 2


def calibrate(dumps: Sequence[str | os.PathLike[str]], output_path: str | os.PathLike[str],
              *, progress: bool | None = None) -> NoiseFloor:
    """Measure the noise floor of `dumps` (healthy golden-like runs, at least two) and write
    it to `output_path`/noise_floor.json; returns it. A compare of two of them that names an
    op is kept in `NoiseFloor.named` (its differences are still measured: that is the noise
    the user asks about)."""
    paths = [os.fspath(d) for d in dumps]
    if len(paths) < MIN_RUNS:
        raise ConfigError(f"calibrate needs at least {MIN_RUNS} healthy runs, got {len(paths)}; "
                          f"pass two or more dumps")
    if len(set(map(os.path.realpath, paths))) < len(paths):
        raise ConfigError("calibrate got the same dump twice; pass different runs")
    from . import outdir
    from .api import compare
    from .store.records import json_text

    out = os.fspath(output_path)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(f"{out} is a file; pass a directory for the noise floor")
    floor = NoiseFloor(runs=paths)
    for a, b in combinations(paths, 2):
        result = compare(b, a, replay="off", progress=progress)
        floor.add_rows(result.rows)
        floor.pairs += 1
        if result.first_divergence is not None:
            floor.named.append(f"{b} vs {a}: {result.first_divergence.name}")
    with outdir.session(out, keep=paths) as where:
        outdir.atomic_write_text(where / FILE, json_text(floor.to_document(), indent=1), FILE)
    return floor


__all__ = ["calibrate", "MIN_RUNS"]
