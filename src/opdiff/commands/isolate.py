"""`opdiff isolate TARGET GOLDEN`: each op and module call of the target fed golden's recorded
inputs, and whether it is bitwise equal to golden's output (same-input isolation)."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff isolate ./dump/engine ./dump/trainer          # the table, then the summary
  opdiff isolate ./dump/engine ./dump/trainer --named  # only the units that compute otherwise

TARGET and GOLDEN are tensor dumps (task="tensor") of one model, a run directory or one
step/rank directory each. Every op of the target (paired with golden's at the same place in its
module call) and every module call (paired by its path) is re-run on golden's recorded inputs in
the target's dtypes, or, where those inputs are bitwise the target's own, judged by its recorded
outputs: "bitwise equal", "within the dtype's rounding" (1 ulp at most) or "differs". Named are
the innermost units that are not bitwise equal. Exit codes: 0 done, 1 with --fail-on-divergence
when a unit is named, 2 bad input."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "isolate", help="feed each op golden's inputs: which ops compute otherwise",
        description="Same-input isolation: each op and module call of the target re-run on "
                    "golden's recorded inputs; bitwise equal, within the dtype's rounding or "
                    "differs, per unit and per kind.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="tensor dump of the run under suspicion")
    p.add_argument("golden", metavar="GOLDEN", help="tensor dump of the trusted run")
    p.add_argument("--named", action="store_true",
                   help="print only the units named (not bitwise equal, nothing inside them is)")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 1 when a unit is named (for CI)")
    p.set_defaults(run=run)


def run(args) -> int:
    from .paths import dumps_exist

    dumps_exist(args.target, args.golden)       # before torch is imported (seconds)
    from ..comparison.isolation import isolate

    table = isolate(args.target, args.golden)
    print(table.text(named=args.named))
    return 1 if args.fail_on_divergence and table.named else 0
