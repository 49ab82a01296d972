"""The `opdiff` command. Parses arguments, calls the library, sets exit codes.

Exit codes: 0 done (divergences are findings), 1 internal error, 2 bad input (one-line reason).
Each subcommand lives in `opdiff.commands.<name>` with `add_parser(subparsers)` and `run(args)`.

One language across commands: positional dumps or models are TARGET first, GOLDEN second;
`-o OUT` is where files go; `-v` goes before or after the command; `--fail-on-divergence`
makes any command exit 1 on what it looks for (the older `--fail-on-failure` of check and
`--fail-on-overflow` of overflow still work); `--jobs/-j N` are replay processes
(`--replay-jobs` still works); `--progress/--no-progress` (default: on a terminal, when slow).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__
from .errors import OpdiffError

COMMANDS = ("demo", "compare", "calibrate", "check", "trend", "overflow", "onnx", "env", "run",
            "compile-bisect", "explain", "query", "skill", "isolate", "fp8-rank")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default is exit 2 with usage; keep it to one line
        self.exit(2, f"opdiff: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opdiff", description="Find the first operator where two runs of a "
                     "neural network part ways.")
    parser.add_argument("--version", action="version", version=f"opdiff {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what opdiff is doing")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"opdiff.commands.{name.replace('-', '_')}").add_parser(sub)
    for command in sub.choices.values():
        # `opdiff compare A B -v` as well as `opdiff -v compare A B` (errors say "rerun with -v")
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="log what opdiff is doing (also before the command)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Messages already say "opdiff: ..."; a terminal that cannot show "—" gets "?" instead of
    # an encoding error.
    from .terminal import SafeFormatter, one_line

    if args.command != "run":   # `opdiff run` leaves the user's program its streams and logging
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="replace")
        handler = logging.StreamHandler()
        handler.setFormatter(SafeFormatter("%(message)s"))   # names from a dump: no escape codes
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            handlers=[handler])
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except OpdiffError as exc:
        print(f"opdiff: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `opdiff ... | head` closed the pipe: not an error
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("opdiff: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug in opdiff: say so plainly; the traceback helps with -v
        if args.verbose:
            raise
        print(f"opdiff: internal error: {type(exc).__name__}: {one_line(exc)} (rerun with -v for "
              f"the traceback and report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
