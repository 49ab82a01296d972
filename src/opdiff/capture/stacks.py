"""The user's call site: the innermost frames outside torch, opdiff and the standard library."""
from __future__ import annotations

import linecache
import os
import sys
import sysconfig

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OPDIFF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep
_SKIP_PREFIXES = (_TORCH_DIR, _OPDIFF_DIR, _STDLIB_DIR)
# site-packages usually sits inside the stdlib directory, but installed model code
# (transformers, timm, the user's own packages) is where the ops are written: keep it.
_SITE_DIRS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib")})
MAX_FRAMES = 12


# The demo's models stand in for the user's model: their frames are user code.
_DEMO_DIR = os.path.join(_OPDIFF_DIR, "demo") + os.sep


_internal_cache: dict = {}


def is_internal(filename: str) -> bool:
    """True for frames of torch, opdiff and the standard library (cached per file name)."""
    known = _internal_cache.get(filename)
    if known is None:
        known = _internal_cache[filename] = _classify(filename)
    return known


def _classify(filename: str) -> bool:
    if filename.startswith(_DEMO_DIR):
        return False
    if filename.startswith(_SITE_DIRS) and not filename.startswith((_TORCH_DIR, _OPDIFF_DIR)):
        return False
    return filename.startswith(_SKIP_PREFIXES) or filename.startswith("<frozen")


def user_frames(skip: int = 1, limit: int = MAX_FRAMES) -> tuple:
    """(file, line, function) of up to `limit` user frames, innermost first; cheap, no source read."""
    f = sys._getframe(skip)
    out = []
    cache = _internal_cache
    while f is not None and len(out) < limit:
        code = f.f_code
        internal = cache.get(code.co_filename)
        if internal is None:
            internal = is_internal(code.co_filename)
        if not internal:
            out.append((code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(out)


def with_source(frames: tuple) -> tuple:
    """Add the source text of each frame: (file, line, function, code)."""
    return tuple((fn, ln, func, linecache.getline(fn, ln).strip()) for fn, ln, func in frames)
