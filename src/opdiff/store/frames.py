"""Which source files are the user's: one predicate for live frames (capture) and for the stacks
foreign tools wrote on other machines (adapters).

Frames inside torch, the dumping tool (opdiff, msprobe, ptdbg_ascend, torch_npu) and the Python
standard library are internal; installed model code (transformers, timm, the user's packages)
is where the ops are written, so it is the user's. A package that stands in for user code (the
demo's models) says so with `register_user_code`.

    from opdiff.store.frames import is_internal, register_user_code
    is_internal("/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py")   # True
    register_user_code("/path/to/opdiff/demo")    # the demo's models are "user" code
"""
from __future__ import annotations

import os
import re
import sysconfig

_OPDIFF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep
# site-packages usually sits inside the stdlib directory: installed model code is kept.
_SITE_DIRS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib")})

# Tool and framework code wherever it was installed (paths from another machine's dump).
_INTERNAL_ANYWHERE = re.compile(
    r"[\\/](?:site|dist)-packages[\\/](?:torch|torch_npu|msprobe|ptdbg_ascend|opdiff)[\\/]"
    r"|[\\/]lib[\\/]python3(?:\.\d+)?[\\/](?!site-packages|dist-packages)[^\\/]+\.py$"
    r"|^<frozen ")

_SITE_PACKAGES = re.compile(r"[\\/](?:site|dist)-packages[\\/]")

_user_dirs: list[str] = []
_framework_dirs: list[str] = [_OPDIFF_DIR]
_cache: dict[str, bool] = {}


def register_user_code(directory: str) -> None:
    """Treat files under `directory` as user code even inside opdiff or a framework."""
    d = os.path.abspath(directory).rstrip(os.sep) + os.sep
    if d not in _user_dirs:
        _user_dirs.append(d)
        _cache.clear()


def register_framework_dir(directory: str) -> None:
    """Treat files under `directory` as internal (torch registers itself on first use)."""
    d = os.path.abspath(directory).rstrip(os.sep) + os.sep
    if d not in _framework_dirs:
        _framework_dirs.append(d)
        _cache.clear()


def is_internal(filename: str) -> bool:
    """True for frames of torch, the dumping tools and the standard library (cached per file)."""
    known = _cache.get(filename)
    if known is None:
        known = _cache[filename] = _classify(filename or "")
    return known


def _classify(filename: str) -> bool:
    if filename.startswith(tuple(_user_dirs)):
        return False
    if filename.startswith(tuple(_framework_dirs)) or filename.startswith("<frozen"):
        return True
    if filename.startswith(_SITE_DIRS) or _SITE_PACKAGES.search(filename):
        # (any site-packages: a venv made with --system-site-packages also imports from the
        # base interpreter's, which sits inside the stdlib directory)
        return bool(_INTERNAL_ANYWHERE.search(filename))
    if filename.startswith(_STDLIB_DIR):
        return True
    return bool(_INTERNAL_ANYWHERE.search(filename))


def cache() -> dict[str, bool]:
    """The per-file answers so far (capture's frame walk reads it directly: one dict lookup
    per frame on the hot path)."""
    return _cache


__all__ = ["is_internal", "register_user_code", "register_framework_dir", "cache"]
