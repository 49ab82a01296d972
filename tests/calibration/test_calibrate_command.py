"""`opdiff calibrate` and `opdiff compare --noise` from the command line, on real dumps: bad
input is one line and exit 2 before torch is imported; the noise floor written follows its
schema; a compare against it names a planted fault with its error as a multiple of its floor,
in the terminal and in the rows, and passes a healthy run that the fixed float32 tolerances
blame (a weight nudged from 0 to the smallest subnormal)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from opdiff import schemas
from opdiff.comparison.noise_floor import NoiseFloor
from opdiff.report.rows import iter_rows

from noisekit import healthy, run

PROBE = textwrap.dedent("""
    import sys
    from opdiff.cli import main
    rc = main(sys.argv[1:])
    print("torch imported" if "torch" in sys.modules else "torch not imported", rc)
""")

pytestmark = pytest.mark.filterwarnings("ignore:Warning only once for all operators")


def _cli(*argv):
    p = subprocess.run([sys.executable, "-c", PROBE, *map(str, argv)], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ))
    return p.stdout.strip().splitlines(), p.stderr.strip()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibrate")
    return root, [run(root / "g"), run(root / "h0", **healthy(0)), run(root / "h1", **healthy(1))]


def test_bad_input_is_one_line_and_exit_2_before_torch(dumps, tmp_path):
    root, (g, h0, _) = dumps
    cases = [(("calibrate", g, "-o", tmp_path / "n"),
              "calibrate needs at least 2 healthy runs, got 1; pass two or more dumps"),
             (("calibrate", g, tmp_path / "missing", "-o", tmp_path / "n"),
              f"{tmp_path / 'missing'}: no such file or directory"),
             (("compare", h0, g, "--noise", tmp_path / "none"),
              f"{tmp_path / 'none'}: no noise_floor.json there; make one with 'opdiff calibrate "
              f"GOLDEN_A GOLDEN_B -o {tmp_path / 'none'}'")]
    for argv, said in cases:
        out, err = _cli(*argv)
        assert out[-1] == "torch not imported 2", (argv, out, err)
        assert err == f"opdiff: error: {said}"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "noise_floor.json").write_text('{"floors": 3}')
    out, err = _cli("compare", h0, g, "--noise", tmp_path / "bad")
    assert out[-1] == "torch imported 2" and err.count("\n") == 0
    assert "not a noise floor written by 'opdiff calibrate'" in err


@pytest.mark.slow
def test_calibrate_then_compare_with_noise(dumps, tmp_path):
    root, runs = dumps
    noise = tmp_path / "noise"
    out, err = _cli("calibrate", *runs, "-o", noise)
    assert out[-1] == "torch imported 0", err
    doc = json.loads((noise / "noise_floor.json").read_text())
    schemas.validate("noise-floor", doc)
    assert doc["pairs"] == 3 and len(doc["floors"]) > 100
    floor = NoiseFloor.load(noise).floor_for("Functional.linear.2.forward.output.0")
    assert floor is not None and floor.samples == 3 and floor.error > 0

    target = run(tmp_path / "t", fault={"op": "Functional.linear", "call": 2,
                                        "scale": 1 + 20 * floor.error}, **healthy(5))
    out, err = _cli("compare", target, runs[0], "--noise", noise, "-o", tmp_path / "out")
    text = "\n".join(out)
    assert out[-1] == "torch imported 0", err
    assert "Functional.linear.2.forward" in text and "its measured floor" in text, text
    rows = {r.golden_name: r for r in iter_rows(next((tmp_path / "out").glob("rows.jsonl")))}
    row = rows["Functional.linear.2.forward.output.0"]
    assert row.result == "error" and "\u00d7 its measured floor" in row.reason, row.reason

    healthy_run = run(tmp_path / "h", **healthy(6))
    out, err = _cli("compare", healthy_run, runs[0], "--noise", noise)
    assert out[-1] == "torch imported 0", err
    assert "judged against measured noise floors" in "\n".join(out)
    # without the floor, the fixed tolerances name the zero bias nudged to a subnormal
    from opdiff import compare
    assert compare(healthy_run, runs[0]).first_divergence is not None
    assert compare(healthy_run, runs[0], noise=noise).first_divergence is None


@pytest.mark.slow
def test_runs_that_agree_bit_for_bit_measure_no_noise_and_change_nothing(dumps, tmp_path):
    # the same healthy run recorded twice: a floor of 0 everywhere, which must not make the
    # compare stricter than its fixed tolerances (a faulted op within them stays unnamed)
    root, (g, _, _) = dumps
    again = run(tmp_path / "again")
    out, err = _cli("calibrate", g, again, "-o", tmp_path / "noise")
    assert out[-1] == "torch imported 0", err
    assert any("agreed bit for bit" in line for line in out), out
    from opdiff import compare
    target = run(tmp_path / "t", fault={"op": "Functional.linear", "call": 1,
                                        "scale": 1 + 1e-6})
    fixed = compare(target, g)
    measured = compare(target, g, noise=tmp_path / "noise")
    assert fixed.first_divergence is None and measured.first_divergence is None
