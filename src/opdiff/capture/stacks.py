"""The user's call site: the innermost frames outside torch, opdiff and the standard library
(what is the user's code is `opdiff.store.frames.is_internal`'s answer)."""
from __future__ import annotations

import linecache
import os
import sys
from types import FrameType

import torch

from ..store import frames
from .callsite import is_call_frame

MAX_FRAMES = 12

# Torch wherever it is installed (a source build outside site-packages too).
frames.register_framework_dir(os.path.dirname(torch.__file__))
_internal = frames.cache()   # the predicate's answers so far: one dict lookup per frame


def user_frames(skip: int = 1, limit: int = MAX_FRAMES) -> tuple:
    """(file, line, function) of up to `limit` user frames, innermost first; cheap, no source read."""
    f: FrameType | None = sys._getframe(skip)
    out: list[tuple[str, int, str]] = []
    cache = _internal
    while f is not None and len(out) < limit:
        code = f.f_code
        internal = cache.get(code.co_filename)
        if internal is None:
            internal = frames.is_internal(code.co_filename)
        if not internal and not is_call_frame(code):
            out.append((code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(out)


def with_source(frames_: tuple) -> tuple:
    """Add the source text of each frame: (file, line, function, code)."""
    return tuple((fn, ln, func, linecache.getline(fn, ln).strip()) for fn, ln, func in frames_)
