"""`opdiff demo [-o OUT] [--scenario NAME]`: the whole story, on CPU, in one command."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff demo                                  # seed 000: a 3D-ResNet's `+=` is slightly wrong
  opdiff demo --scenario lstm-backward -o ./lstm-demo
  opdiff demo --scenario wrong-weights         # no op is wrong: one weight element differs
  opdiff demo --list

scenarios:
  iadd            a 3D-ResNet whose `+=` is slightly wrong in one block (default)
  lstm-backward   an LSTM whose backward is wrong while its forward is right
  fp16-overflow   fp16 autocast overflow: where inf is born, online and offline
  bf16-healthy    bf16 autocast vs fp32: differences everywhere, no culprit
  wrong-weights   a checkpoint conversion changed one weight element by 1e-2: the verdict
                  names the parameter (origin parameter, its FQN, the first op reading it)
  dropout         the generator was seeded again after building the model: the dropout
                  masks differ (origin random, pointing to opdiff.seed_all)
  trend           two monitored trainings part at step 30: trend names the step and module

Trains a tiny model twice on CPU (golden, and target with a planted fault, another precision,
other weights or other random numbers; wrong-weights and dropout run each side in its own
process), records both runs with opdiff, compares them and prints the verdict. OUT receives the
dumps, compare_result_{timestamp}.csv, summary.json and report.html (overflow.json for
fp16-overflow). OUT must be new, empty, or an earlier demo's directory (replaced).
Exit codes: 0 done, 1 opdiff missed the planted fault (a bug: please report it), 2 bad input."""


def add_parser(subparsers) -> None:
    from ..demo import DEFAULT_OUTPUT, DEFAULT_SCENARIO

    p = subparsers.add_parser(
        "demo", help="see opdiff find a planted fault, end to end, in a few seconds",
        description="Replay a story end to end on CPU: train a golden and a target run, "
                    "record both, compare them and name the culprit (an op with its source "
                    "line, or an origin: a parameter, the random generator).",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", metavar="OUT", default=DEFAULT_OUTPUT,
                   help=f"directory for the dumps and reports (default: {DEFAULT_OUTPUT})")
    p.add_argument("-s", "--scenario", metavar="NAME", default=DEFAULT_SCENARIO,
                   help=f"which story to play (default: {DEFAULT_SCENARIO}; see --list)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.set_defaults(run=run)


def run(args) -> int:
    from rich.table import Table

    from .. import demo
    from ..report.console import stdout_console

    console = stdout_console()   # piped output is not wrapped at 80 columns
    if args.list:
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(style="bold")
        table.add_column()
        for name, summary in demo.list_scenarios().items():
            table.add_row(name, summary)
        console.print(table)
        return 0
    result = demo.run(args.scenario, args.output, console=console)
    return 0 if result.found else 1
