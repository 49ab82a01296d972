"""`opdiff check DUMP [-o OUT] [--device DEV]`: one run, no golden; every op judged against a
float64 replay on the CPU."""
from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

EXAMPLE = """example:
  opdiff check ./dump/npu/step0/rank0 -o ./out             # task="tensor" dump
  opdiff check ./dump/npu/step0/rank0 -o ./out --device npu  # statistics dump: re-run on the device
  opdiff check ./dump/bf16 --jobs 4 --list Functional.conv2d -o ./out --resume
  opdiff check ./dump/bf16 -o ./out --engine ray --ray-address auto  # the replays as Ray tasks

Each op is re-run in float64 on the CPU (golden) and on the CPU in its recorded dtypes (what a
correct kernel of that dtype gives); the recorded output fails when its error against float64 is
well above that reference kernel's (bitwise for integer outputs, ULP for elementwise ops, an
error ratio for matmul/conv/reductions/norms). Random ops, collectives and ops whose inputs were
not saved are listed as not checked, with the reason. OUT receives check_result_*.csv,
summary.json and report.html. Exit codes: 0 done, 1 with --fail-on-failure when an op failed,
2 bad input."""


def add_parser(subparsers: Any) -> None:
    """Register `opdiff check`."""
    p = subparsers.add_parser(
        "check", help="judge every op of one dump against a float64 CPU replay (no golden run)",
        description="Judge every op of one dump against the op re-run in float64 on the CPU: no "
                    "golden run, no second device.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", metavar="DUMP", help="one step/rank directory (or a root holding one)")
    p.add_argument("-o", "--output", metavar="OUT", default=None,
                   help="directory for the CSV, summary.json and report.html (default: none "
                        "written, terminal summary only)")
    p.add_argument("--device", metavar="DEV", default=None,
                   help="re-run the ops of a statistics dump on this torch device (cpu, cuda:0, "
                        "npu:0, xpu, mps; needed for statistics dumps)")
    p.add_argument("--jobs", "-j", metavar="N", type=int, default=1,
                   help="replay ops in N processes (default 1)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where the replays run: local = --jobs processes on this machine "
                        "(default), ray = Ray tasks (pip install opdiff[ray])")
    p.add_argument("--ray-address", metavar="ADDR", default=None,
                   help="the Ray cluster for --engine ray (auto, host:6379; default: a local one)")
    p.add_argument("--list", metavar="NAME", nargs="+", default=[], dest="names",
                   help="check only these ops (exact name, name without counter, or substring)")
    p.add_argument("--scope", metavar="NAME", nargs="+", default=[],
                   help="check the ops from the first NAME through the second")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted check in OUT (skips ops in OUT/check_progress.jsonl)")
    p.add_argument("--max-tensor-mb", metavar="MB", default=None,
                   help="the largest tensor opdiff makes from what a dump claims (a "
                        "reference repeating its bytes, a statistics record's shape, a "
                        "replayed op's result), in MiB (default: OPDIFF_MAX_TENSOR_MB, "
                        "else 4096); a larger one is not made: its op is not checked, with a one-line reason")
    p.add_argument("--fail-on-divergence", "--fail-on-failure", action="store_true",
                   dest="fail_on_failure",
                   help="exit 1 when an op failed its check (for CI; --fail-on-failure is the "
                        "older spelling)")
    p.add_argument("--source-root", metavar="DIR", default=None,
                   help="show the source lines around a failure's line in report.html from "
                        "the run's .py files under DIR, none hidden or in .git (default: the "
                        "lines the dump holds)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when slow and on a terminal)")
    p.set_defaults(run=run)


def run(args: Any) -> int:
    """Run the check and print the summary; the return value is the exit code."""
    from .paths import dumps_exist, output_is_a_directory

    dumps_exist(args.dump)                      # before torch is imported (seconds)
    output_is_a_directory(args.output)
    from ..check.device import usable_device
    from ..check.outputs import prepare
    from ..errors import ConfigError

    from ..store.limits import set_max_tensor_mb

    set_max_tensor_mb(args.max_tensor_mb)     # in the environment: workers see it too
    if args.ray_address is not None and args.engine != "ray":
        raise ConfigError("--ray-address is for --engine ray")
    if args.engine == "ray" and args.jobs != 1:
        raise ConfigError("--jobs is for --engine local; with --engine ray the cluster's CPUs "
                          "decide how many ops run at once")
    if args.device is not None:
        usable_device(args.device)        # before OUT is cleared: a typo costs nothing
    if args.source_root is not None and not os.path.isdir(args.source_root):
        raise ConfigError(f"--source-root {args.source_root}: not a directory")
    if args.resume and not args.output:
        raise ConfigError("--resume needs -o OUT (the progress of the interrupted check is there)")
    with contextlib.ExitStack() as held:
        out = held.enter_context(prepare(args.output, keep=(args.dump,), resume=args.resume)) \
            if args.output else None
        return _check(args, out)


def _check(args: Any, out: Any) -> int:
    from ..check import check_dump
    from ..check.console import print_check
    from ..check.outputs import PROGRESS, write_check_outputs
    from ..report.console import Progress, stdout_console

    bar: list[Progress] = []

    def on_total(n: int) -> None:
        bar.append(Progress(n, args.progress).__enter__())

    try:
        result = check_dump(args.dump, device=args.device, names=args.names, scope=args.scope,
                            jobs=args.jobs, progress_file=(out / PROGRESS) if out else None,
                            resume=args.resume, on_total=on_total, engine=args.engine,
                            ray_address=args.ray_address,
                            on_done=lambda op: bar[0].advance() if bar else None)
    finally:
        if bar:
            bar[0].__exit__(None, None, None)
    console = stdout_console()
    print_check(result, console)
    if out is not None:
        files = write_check_outputs(result, out, source_root=args.source_root)
        console.print(f"wrote {', '.join(files.values())}")
    return 1 if args.fail_on_failure and result.failures else 0
