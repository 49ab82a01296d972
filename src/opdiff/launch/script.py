"""Run a Python script or module in this process as `python script.py` / `python -m mod` would.

    status = run_script("path", "train.py", ["--lr", "3e-4"])

sys.argv and sys.path[0] are the script's; SystemExit gives its exit status (None 0, a number
itself, anything else printed and 1); an exception is printed by sys.excepthook from the
script's first frame on (opdiff's and runpy's frames above it are not the user's) and gives 1;
KeyboardInterrupt ends the process by SIGINT, as Python does.
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
from types import TracebackType
from typing import Optional

_OURS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
         os.path.abspath(runpy.__file__))


def _user_part(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """The traceback from the first frame that is neither runpy's nor opdiff's launch code."""
    first = tb
    while tb is not None:
        raw = tb.tb_frame.f_code.co_filename
        name = os.path.abspath(raw)
        if not (name.startswith(_OURS[0]) or name == _OURS[1] or raw.startswith("<frozen runpy")):
            return tb
        tb = tb.tb_next
    return first


def exit_status(code: object) -> int:
    """What Python's exit status is for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF if code >= 0 else code
    sys.stderr.write(f"{code}\n")
    return 1


def run_script(kind: str, what: str, argv: list[str]) -> int:
    """Run it; return its exit status (see the module docstring)."""
    launcher = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(launcher) == "opdiff":     # the console script: not the user's frame
        from ..store.frames import register_framework_dir

        register_framework_dir(os.path.dirname(launcher))
    if kind == "path":
        sys.argv = [what, *argv]
        sys.path[0] = os.path.dirname(os.path.abspath(what))
    else:
        sys.argv = [what, *argv]       # runpy puts the module's file here
        sys.path[0] = os.getcwd()
    try:
        if kind == "path":
            runpy.run_path(what, run_name="__main__")
        else:
            runpy.run_module(what, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exit_status(exc.code)
    except KeyboardInterrupt as exc:
        _print(exc)
        _die_by(signal.SIGINT)
        return 130
    except BaseException as exc:  # noqa: BLE001 - the user's exception, printed as Python would
        _print(exc)
        return 1
    return 0


def _print(exc: BaseException) -> None:
    tb = _user_part(exc.__traceback__)
    exc.__traceback__ = tb          # (the default hook prints the exception's own traceback)
    sys.excepthook(type(exc), exc, tb)


def _die_by(sig: int) -> None:
    import atexit

    atexit._run_exitfuncs()     # as Python does before it ends itself by the signal
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


__all__ = ["run_script", "exit_status"]
