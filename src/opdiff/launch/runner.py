"""`opdiff run -- CMD`: launch CMD with capture in every one of its Python processes.

    run_command(settings, ["python", "train.py", "--lr", "3e-4"])   # returns only on our errors

A Python script (`python [-u] script.py ...`, `python -m pkg ...` with this interpreter, or a
bare `script.py`) runs in this process through runpy after the hooks are installed: its
arguments, stdin/stdout, exit code and signals are its own, and an exception it raises is
printed as Python prints it, from the script's own frames. Any other command (torchrun,
accelerate launch, deepspeed, a shell script, and `python` with any interpreter option but `-u`
and `-q`: `-O`, `-B`, `-s`, `-W ...`, `-X ...`, which only a new interpreter honours) replaces
this process (`os.execvpe`) with the environment that reaches its Python processes. Options that
would skip that start-up (`-E`, `-I`, `-S`: PYTHONPATH or site ignored) are refused rather than
silently capturing nothing. A command that cannot be run is an OpdiffError (exit 2, one line).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from ..errors import ConfigError
from . import ENV
from .settings import RunSettings

SITE_DIR = str(Path(__file__).resolve().parent / "site")
# python options this process can honour itself (others: a new interpreter, run as a command)
_PLAIN_FLAGS = {"-u", "-q"}
# python options that skip PYTHONPATH or site, so opdiff's start-up never runs in that process
_NO_STARTUP = frozenset("EIS")


def child_environment(settings: RunSettings, env: Optional[dict[str, str]] = None) -> dict[str, str]:
    """`env` (default os.environ) with the settings and the start-up directory on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    out[ENV] = settings.encode()
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    out["PYTHONPATH"] = os.pathsep.join([SITE_DIR] + paths)
    return out


def _same_interpreter(program: str) -> bool:
    found = shutil.which(program)
    if found is None:
        return False
    try:
        return os.path.samefile(os.path.realpath(found), os.path.realpath(sys.executable))
    except OSError:
        return False


def in_process_target(cmd: list[str]) -> Optional[tuple[str, str, list[str]]]:
    """("path" | "module", the script or module, its argv[1:]) when CMD is a Python program this
    interpreter can run here; None for any other command."""
    if not cmd:
        return None
    first = cmd[0]
    if first.endswith(".py") and not os.path.basename(first).startswith("-"):
        return ("path", first, cmd[1:])
    if not _same_interpreter(first):
        return None
    rest = list(cmd[1:])
    while rest and rest[0] in _PLAIN_FLAGS:
        if rest[0] == "-u":     # unbuffered: what the flag asks of this process's streams
            for stream in (sys.stdout, sys.stderr):
                if hasattr(stream, "reconfigure"):
                    stream.reconfigure(line_buffering=True, write_through=True)
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m":
        return ("module", rest[1], rest[2:])
    if rest and not rest[0].startswith("-"):
        return ("path", rest[0], rest[1:])
    return None


def _skips_startup(args: list[str]) -> Optional[str]:
    """The option among python's own (before the script, `-m` or `-c`) that skips site or
    PYTHONPATH (`-E`, `-I`, `-S`, alone or in a group such as `-OE`), or None."""
    words = iter(args)
    for arg in words:
        if arg in ("-", "--") or not arg.startswith("-") or arg.startswith("--"):
            return None
        for i, letter in enumerate(arg[1:]):
            if letter in _NO_STARTUP:
                return f"-{letter}"
            if letter in "cm":
                return None             # what follows is the program
            if letter in "WX":
                if i == len(arg) - 2:
                    next(words, None)   # its value is the next word
                break
    return None


def check_settings(settings: RunSettings) -> None:
    """Raise the ConfigError every process would meet, before anything starts."""
    if settings.monitor is None:
        settings.debugger_config()
    elif not settings.monitor.get("path"):
        raise ConfigError("--monitor needs a directory")


def run_command(settings: RunSettings, cmd: list[str]) -> int:
    """Run CMD under opdiff (see the module docstring). Returns the script's exit status when
    it runs here; never returns when CMD replaces this process."""
    if not cmd:
        raise ConfigError("opdiff run needs a command after '--', e.g. opdiff run --dump ./dump -- python train.py")
    check_settings(settings)
    skipped = _skips_startup(cmd[1:]) if os.path.basename(cmd[0]).startswith("python") else None
    if skipped:
        raise ConfigError(f"'{cmd[0]} {skipped}' skips the start-up opdiff run relies on "
                          f"(PYTHONPATH and site): nothing would be captured; drop {skipped}, "
                          f"or call opdiff.PrecisionDebugger in the script")
    target = in_process_target(cmd)
    env = child_environment(settings)
    if target is None:
        program = shutil.which(cmd[0])
        if program is None:
            raise ConfigError(f"cannot run '{cmd[0]}': no such command or file")
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvpe(program, cmd, env)
        except OSError as exc:
            raise ConfigError(f"cannot run '{cmd[0]}': {exc.strerror or exc}") from None
    kind, what, argv = target
    if kind == "path" and not os.path.isfile(what):
        raise ConfigError(f"cannot run '{what}': no such file")
    os.environ.clear()
    os.environ.update(env)
    from . import bootstrap
    from .script import run_script

    bootstrap.install()
    return run_script(kind, what, argv)


__all__ = ["run_command", "child_environment", "in_process_target", "SITE_DIR"]
