"""`opdiff calibrate GOLDEN_A GOLDEN_B [...] -o NOISE`: a per-tensor noise floor from healthy runs."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff calibrate ./dump/threads1 ./dump/threads8 ./dump/seed2 -o ./noise
  opdiff compare ./dump/target ./dump/threads1 --noise ./noise -o ./out

Each GOLDEN is a dump of a healthy run of the same code, differing only as healthy runs do
(another thread count, nondeterministic kernels, a trusted device pair, weights through a
checkpoint round trip). Every two are compared; each tensor keeps the largest difference any
two showed. NOISE receives noise_floor.json; `opdiff compare --noise NOISE` then judges each op
against max(dtype floor, k x its floor) (k: --threshold noise_multiple=K, default 3) and says
each error as a multiple of its floor. Exit codes: 0 done, 2 bad input."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure each op's noise floor from two or more healthy runs",
        description="Compare healthy golden-like runs with one another and keep, per tensor, "
                    "how far apart they lie: the noise floor `opdiff compare --noise` judges by.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("goldens", metavar="GOLDEN", nargs="+",
                   help="dumps of healthy runs (two or more)")
    p.add_argument("-o", "--output", metavar="NOISE", required=True,
                   help="directory for noise_floor.json")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..errors import ConfigError
    from .paths import dumps_exist, output_is_a_directory

    if len(args.goldens) < 2:       # before torch is imported (seconds)
        raise ConfigError(f"calibrate needs at least 2 healthy runs, got {len(args.goldens)}; "
                          f"pass two or more dumps")
    dumps_exist(*args.goldens)
    output_is_a_directory(args.output)
    from ..calibration import calibrate
    from ..terminal import console

    floor = calibrate(args.goldens, args.output, progress=args.progress)
    out = console()
    moved = sum(1 for f in floor.floors.values() if f.error > 0)
    out.print(f"noise floor of {len(floor.floors)} tensors ({moved} differ between the runs) "
              f"from {floor.pairs} compare(s) of {len(floor.runs)} runs written to "
              f"{args.output}/noise_floor.json")
    if not moved:
        out.print("note: the runs agreed bit for bit: no noise was measured, and compare --noise "
                  "judges as without it; calibrate from runs that differ as healthy runs do "
                  "(another thread count, device or nondeterministic kernels)")
    for named in floor.named:
        out.print(f"note: healthy runs already part ways by opdiff's fixed tolerances: {named}")
    return 0
