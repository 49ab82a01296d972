"""`opdiff trend TARGET [GOLDEN] [-o OUT]`: from monitor streams, the step and module where two
runs part, or where one run's inf/NaN and spikes start."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff trend ./mon/npu ./mon/gpu -o ./out     # two runs: where they part
  opdiff trend ./mon/npu -o ./out               # one run: inf/NaN and spikes
  python -c "import pandas; print(pandas.read_csv('mon/npu/rank0/metrics.csv'))"

TARGET and GOLDEN are directories written by opdiff.Monitor(model, PATH, optimizer=opt) (with
rank*/ inside, or one rank directory). Two runs: steps and modules are aligned by name, rank
by rank; the normal drift between the runs is learned from the earlier steps and the dtype, and
the first step where a quantity leaves it is where they part: the first module in forward
order, then backward, then gradients and the optimizer (or "gradual drift, no step stands
out"). One run: the first step and module with inf/NaN, and loss or gradient-norm spikes with
the module where each starts. OUT receives summary.json, trend.html (curves) and next_dump.json,
a config for opdiff.PrecisionDebugger(config_path=...) that dumps that step around that module.
Exit codes: 0 done, 1 with --fail-on-divergence when the runs part (or one run has inf/NaN),
2 bad input (a missing directory, an empty or corrupt stream)."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "trend", help="find the step and module where two monitored runs part",
        description="Read opdiff.Monitor streams: name the step and module where two runs part, "
                    "or where one run's inf/NaN and spikes start, and write the config that "
                    "dumps exactly that step and region.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="the monitor directory of the run to check")
    p.add_argument("golden", metavar="GOLDEN", nargs="?", default=None,
                   help="the monitor directory of the trusted run (omit for one-run alerts)")
    p.add_argument("-o", "--output", metavar="OUT", default=None,
                   help="directory for summary.json, trend.html and next_dump.json "
                        "(default: terminal summary only)")
    p.add_argument("--sigma", type=float, default=None, metavar="Z",
                   help="how far beyond the learned drift a step must lie, in robust sigmas "
                        "(default 8 for two runs, 6 for spikes)")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 1 when the runs part, or one run has inf/NaN (for CI)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..errors import ConfigError
    from ..trend import trend
    from ..trend.console import print_trend

    if args.sigma is not None and not args.sigma > 0:
        raise ConfigError(f"--sigma must be a positive number; got {args.sigma}")
    result = trend(args.target, args.golden, output=args.output, sigma=args.sigma)
    print_trend(result)
    for _label, path in result.files.items():
        print(f"wrote {path}")
    return 1 if args.fail_on_divergence and result.found else 0
