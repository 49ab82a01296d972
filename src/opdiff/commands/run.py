"""`opdiff run [options] -- CMD ...`: capture (or monitor) a training run without editing it."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run", help="run a training command with capture in every process, no code changes",
        description="Run CMD (python train.py, torchrun ..., accelerate launch ..., a script) with "
                    "opdiff in every Python process it starts: the model, the step boundaries "
                    "(optimizer steps) and the configured steps and ranks are found without edits. "
                    "The command's exit status, output and signals are its own.",
        epilog="examples:\n"
               "  opdiff run --dump ./dump/npu --level mix --steps 0-1 -- python train.py --lr 3e-4\n"
               "  torchrun --nproc_per_node 8 -m opdiff run --config dump.json -- train.py\n"
               "  opdiff run --monitor ./mon/npu -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dump", metavar="DIR", help="dump directory (PrecisionDebugger's dump_path)")
    p.add_argument("--task", choices=("statistics", "tensor", "overflow_check"), help="what to record "
                   "(default statistics)")
    p.add_argument("--level", choices=("L0", "L1", "mix", "L2"), help="modules, torch API calls, "
                   "both, or aten ops (default mix)")
    p.add_argument("--steps", metavar="LIST", help="steps to record: 0,2,5-7 (default 0; 'all')")
    p.add_argument("--ranks", metavar="LIST", help="ranks to record: 0,1 (default all)")
    p.add_argument("--config", metavar="JSON", help="msprobe-style config.json (the options above win)")
    p.add_argument("--monitor", metavar="DIR", help="run opdiff.Monitor on every step into DIR instead")
    p.add_argument("--model", metavar="CLASS", help="class name of the model to record, when the "
                   "first module called in a step is not it")
    p.add_argument("--control", metavar="JSON", help="a file read at every step boundary when it "
                   "changed: {\"steps\": [120, 121]} records those steps from then on, "
                   "{\"steps\": []} nothing")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    p.set_defaults(run=run)


def _int_list(text: str | None, what: str) -> list | None:
    from ..errors import ConfigError

    if text is None:
        return None
    if text.strip().lower() == "all":
        return []
    out: list = []
    for part in text.replace(" ", "").split(","):
        if part.isdigit():
            out.append(int(part))
        elif "-" in part and all(x.isdigit() for x in part.split("-", 1)):
            out.append(part)
        else:
            raise ConfigError(f"--{what} takes numbers and ranges such as 0,2,5-7; got {text!r}")
    return out


def settings_from(args):
    """The RunSettings the arguments ask for."""
    from ..errors import ConfigError
    from ..launch.settings import RunSettings

    if args.monitor:
        if args.dump or args.config:
            raise ConfigError("--monitor records every step on its own; drop --dump/--config")
        return RunSettings(monitor={"path": args.monitor}, model=args.model)
    dump = {"dump_path": args.dump, "task": args.task, "level": args.level,
            "step": _int_list(args.steps, "steps"), "rank": _int_list(args.ranks, "ranks")}
    if not args.config:
        dump.setdefault("dump_path", None)
        dump["level"] = dump["level"] or "mix"
        dump["step"] = [0] if dump["step"] is None else dump["step"]
        if not dump["dump_path"]:
            raise ConfigError("say where to write: --dump DIR (or --config dump.json, or --monitor DIR)")
    return RunSettings(dump={k: v for k, v in dump.items() if v is not None},
                       config_path=args.config, model=args.model, control=args.control)


def run(args) -> int:
    from ..launch.runner import run_command

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return run_command(settings_from(args), cmd)
