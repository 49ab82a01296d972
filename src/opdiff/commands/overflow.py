"""`opdiff overflow DUMP [-o OUT]`: where did inf/NaN first appear, and where did it spread."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff overflow ./dump/npu -o ./out
  opdiff overflow ./dump/bf16/step3/rank0 --headroom 1

DUMP is a statistics or tensor dump (a dump root, one step/rank directory, or its index file)
written by opdiff, msprobe or ptdbg_ascend. The origin is the first op, forward or backward, whose
inputs are finite and whose outputs are not. Steps where only gradients overflowed and
GradScaler skipped the step are reported as "skipped by loss scaler". In fp32/bf16 runs, ops whose
outputs would overflow in fp16 are listed as headroom warnings. OUT receives overflow.json.
Exit codes: 0 done (an overflow is a finding), 1 with --fail-on-overflow when one is found,
2 bad input."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "overflow", help="find the op where inf/NaN was born",
        description="Find the op that created inf/NaN in a dump, the ops it spread through, "
                    "steps skipped by the loss scaler, and ops that would overflow in fp16.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", metavar="DUMP", help="dump root, step/rank directory or index file")
    p.add_argument("-o", "--output", metavar="OUT", default=None,
                   help="directory for overflow.json (default: terminal summary only)")
    p.add_argument("--headroom", metavar="FACTOR", type=float, default=2.0,
                   help="flag outputs with max|x| * FACTOR >= the fp16 maximum (1: only values "
                        "that would overflow; default 2)")
    p.add_argument("--fail-on-divergence", "--fail-on-overflow", action="store_true",
                   dest="fail_on_overflow",
                   help="exit 1 when an op created inf/NaN (for CI); scaler-skipped steps pass "
                        "(--fail-on-overflow is the older spelling)")
    p.add_argument("--source-root", metavar="DIR", default=None,
                   help="read the origin's source line from the run's .py files under DIR (none "
                        "hidden or in .git) when the dump holds none (foreign dumps; opdiff never "
                        "reads a file just because a dump names it)")
    p.set_defaults(run=run)


def _read_code(result, source_root: str) -> None:
    """Fill the origins' missing code lines from the files under --source-root."""
    import dataclasses
    import os

    from ..comparison.reasons import with_code
    from ..errors import ConfigError

    if not os.path.isdir(source_root):
        raise ConfigError(f"--source-root {source_root}: not a directory")
    for step in result.steps:
        step.origins = [dataclasses.replace(o, location=with_code(o.location, source_root))
                        for o in step.origins]


def run(args) -> int:
    from ..overflow import INHERITED, OVERFLOW, analyze
    from ..overflow.console import print_overflow
    from ..report.console import stdout_console

    result = analyze(args.dump, headroom_factor=args.headroom)
    if args.source_root is not None:
        _read_code(result, args.source_root)
    if args.output:
        path = result.write_json(args.output)
    print_overflow(result, stdout_console())    # piped: whole lines, no wrap at 80 columns
    if args.output:
        print(f"wrote {path}")
    return 1 if args.fail_on_overflow and result.status in (OVERFLOW, INHERITED) else 0
