"""Issue 47's must-hold for the measured noise floor, on a tiny transformer's training step:
20 healthy pairs (thread counts, the loss summed in another order, every weight nudged by one
ulp) name no op when judged against the floor `opdiff calibrate` measured from 4 other healthy
runs; a fault at 5x an op's measured floor is named in at least 19 of 20."""
from __future__ import annotations

import pytest

import opdiff
from opdiff.calibration import calibrate

from noisekit import healthy, run

PAIRS = 20
LINEARS = 8         # Functional.linear calls of the forward (2 blocks x qkv, proj, up, down)

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:Warning only once for all operators")]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise")
    golden = run(root / "golden")
    runs = [run(root / f"healthy{i}", **healthy(100 + i)) for i in range(4)]
    floor = calibrate([golden, *runs], root / "noise")
    return root, golden, floor


def test_healthy_pairs_name_nothing_against_their_measured_floor(calibrated):
    root, golden, _ = calibrated
    named = []
    for i in range(PAIRS):
        target = run(root / f"t{i}", **healthy(i))
        fd = opdiff.compare(target, golden, noise=root / "noise").first_divergence
        if fd is not None:
            named.append((i, fd.name))
    assert named == []


def test_a_fault_at_five_times_its_floor_is_named_in_19_of_20(calibrated):
    root, golden, floor = calibrated
    named, missed = 0, []
    for i in range(PAIRS):
        call = i % LINEARS
        measured = floor.floor_for(f"Functional.linear.{call}.forward.output.0")
        assert measured is not None and measured.error > 0
        fault = {"op": "Functional.linear", "call": call, "scale": 1 + 5 * measured.error}
        target = run(root / f"f{i}", fault=fault, **healthy(i))
        result = opdiff.compare(target, golden, noise=root / "noise")
        fd = result.first_divergence
        if fd is not None and fd.name == f"Functional.linear.{call}.forward":
            named += 1
            assert "its measured floor" in fd.reason
        else:
            missed.append((i, fd and fd.name))
    assert named >= 19, missed
