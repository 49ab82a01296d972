"""Checks of a command's paths that need no torch: a dump that does not exist, or `-o OUT`
naming a file, is said in a fraction of a second, before torch is imported and long before the
work starts (importing torch alone takes seconds).

    from opdiff.commands.paths import dumps_exist, output_is_a_directory
    dumps_exist(args.target, args.golden)
    output_is_a_directory(args.output)

They say what the library would say later (`store/reader.py`, `outdir/`); the library still
checks everything itself.
"""
from __future__ import annotations

import os

from ..errors import ConfigError, DumpError


def dumps_exist(*paths) -> None:
    """DumpError for the first path that does not exist."""
    for p in paths:
        if p is not None and not os.path.lexists(p):
            raise DumpError(f"{os.fspath(p)}: no such file or directory")


def output_is_a_directory(out) -> None:
    """ConfigError when OUT exists and is not a directory (a missing OUT is created later)."""
    if out is not None and os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(f"{os.fspath(out)} is a file; pass a directory for the output")


def noise_exists(noise) -> None:
    """ConfigError when `--noise` names neither a noise_floor.json nor a folder holding one."""
    if noise is None:
        return
    p = os.fspath(noise)
    if not (os.path.isfile(p) or os.path.isfile(os.path.join(p, "noise_floor.json"))):
        raise ConfigError(f"{p}: no noise_floor.json there; make one with "
                          f"'opdiff calibrate GOLDEN_A GOLDEN_B -o {p}'")
