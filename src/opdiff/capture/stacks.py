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


_MAX_SITES = 1 << 16
_sites: dict = {}     # (id(code), lasti) -> (code, its (file, line, function) or None: not the user's)
_registered = (-1, -1)   # frames' registered directories when _sites was filled


def user_frames(skip: int = 1, limit: int = MAX_FRAMES, anchor: tuple | None = None) -> tuple:
    """(file, line, function) of up to `limit` user frames, innermost first; cheap, no source read.

    What each frame contributes is looked up by its code object and instruction offset (the line
    follows from them): one dictionary lookup per frame instead of a line-table decode and the
    internal-file test. The entry holds the code object, so its id is not reused meanwhile.

    `anchor`: (a frame, the user frames from it outward), taken while that frame runs (the
    module call an op runs in, see modules.py): the frames outside it cannot change while it
    runs, so the walk stops there.
    """
    return frames_from(sys._getframe(skip), limit, anchor)


def frames_from(f: FrameType | None, limit: int = MAX_FRAMES, anchor: tuple | None = None) -> tuple:
    """`user_frames` from frame `f` outward."""
    global _registered
    stop, above = anchor if anchor is not None else (None, ())
    out: list[tuple[str, int, str]] = []
    sites = _sites
    if _registered != (len(frames._user_dirs), len(frames._framework_dirs)):
        sites.clear()    # a directory was registered since (the lists only grow): ask again
        _registered = (len(frames._user_dirs), len(frames._framework_dirs))
    while f is not None:
        if f is stop:
            out.extend(above[:limit - len(out)])
            break
        code = f.f_code
        entry = sites.get((id(code), f.f_lasti))
        if entry is None or entry[0] is not code:
            entry = _site(f, code)
        if entry[1] is not None:
            out.append(entry[1])
            if len(out) >= limit:
                break
        f = f.f_back
    return tuple(out)


def _site(f: FrameType, code) -> tuple:
    internal = _internal.get(code.co_filename)
    if internal is None:
        internal = frames.is_internal(code.co_filename)
    where = None if internal or is_call_frame(code) else (code.co_filename, f.f_lineno, code.co_name)
    if len(_sites) >= _MAX_SITES:      # generated code (exec in a loop) must not grow this forever
        _sites.clear()
    entry = _sites[(id(code), f.f_lasti)] = (code, where)
    return entry


CONTEXT_RADIUS = 2     # lines kept around the innermost frame's line


_MAX_SOURCED = 1 << 14
_sourced: dict = {}   # user frames -> the same frames with their source (`with_source`)


def with_source(frames_: tuple) -> tuple:
    """Add the source text of each frame: (file, line, function, code); the innermost frame
    also gets the lines around its own, ((line number, text), ...), as a fifth item. Read here,
    in the user's own process, once per call site and process (kept for the steps and
    debuggers to come: linecache keeps a file's lines once read, so the text is the same): a
    compare shows source lines only from the dump (or from the user's --source-root), never
    from a file a dump names (SECURITY.md)."""
    sourced = _sourced.get(frames_)
    if sourced is None:
        if len(_sourced) >= _MAX_SOURCED:      # generated code must not grow this forever
            _sourced.clear()
        sourced = _sourced[frames_] = _read_source(frames_)
    return sourced


def _read_source(frames_: tuple) -> tuple:
    out: list[tuple] = []
    for i, (fn, ln, func) in enumerate(frames_):
        code = linecache.getline(fn, ln).strip()
        if i:
            out.append((fn, ln, func, code))
            continue
        around = ((n, linecache.getline(fn, n).rstrip("\n"))
                  for n in range(max(1, ln - CONTEXT_RADIUS), ln + CONTEXT_RADIUS + 1))
        out.append((fn, ln, func, code, tuple((n, t) for n, t in around if t)))
    return tuple(out)
