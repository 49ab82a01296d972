"""`opdiff compile-bisect [options] -- CMD ...`: which compiler stage makes a compiled step
differ from eager (torch's CompilerBisector, judged by opdiff's verdict)."""
from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compile-bisect", help="which torch.compile stage makes a step differ from eager",
        description="Run CMD (a training script that calls torch.compile and steps a torch.optim "
                    "optimizer) again and again under torch's CompilerBisector: backends (eager, "
                    "aot_eager, aot_eager_decomp_partition, ..., inductor), then the subsystems of "
                    "the first backend that differs, then the N-th application of the subsystem "
                    "that makes the difference. Each run is judged against eager (CMD with "
                    "TORCH_COMPILE_DISABLE=1) by the gradients of one optimizer step, each tensor "
                    "by what its dtype allows. Prints the stage, the subsystem, the application "
                    "and the environment variables that reproduce it by hand (checked). Exit 0 "
                    "with an answer (a stage, 'no compiler stage makes the difference' or "
                    "'inconclusive: ...'), 2 for a command it cannot bisect.",
        epilog="examples:\n"
               "  opdiff compile-bisect -- python train.py --steps 1\n"
               "  opdiff compile-bisect --step 2 --timeout 600 -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step", type=int, default=0, metavar="N",
                   help="judge the gradients of optimizer step N, from 0 (default 0)")
    p.add_argument("--thresholds", metavar="JSON", help="per-dtype thresholds, as compare's")
    p.add_argument("--timeout", type=float, metavar="S", help="seconds one run may take")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 1 when a compiler stage is named")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..errors import ConfigError

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:     # said before torch is imported
        raise ConfigError("compile-bisect needs a command after '--', e.g. "
                          "opdiff compile-bisect -- python train.py")
    if args.step < 0:
        raise ConfigError("--step takes an optimizer step number from 0")
    from ..bisect.command import bisect_command
    from ..terminal import console

    err = console(stderr=True)
    result = bisect_command(cmd, step=args.step, thresholds=args.thresholds,
                            timeout=args.timeout, progress=lambda line: err.print(line, markup=False))
    out = console()
    for line in result.lines():
        out.print(line, markup=False)
    sys.stdout.flush()
    return 1 if args.fail_on_divergence and result.found else 0
