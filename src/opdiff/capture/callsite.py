"""Run an intercepted op so that the warnings it raises point where they would without opdiff.

An op that capture intercepts runs one or more Python frames deeper than the user called it:
under TorchFunctionMode, `F.softmax(x)` runs `F.softmax` again from opdiff's
`__torch_function__`. A warning raised with `stacklevel` (or by C++ code, which reports the
innermost Python frame) then names opdiff's frame, is filtered and de-duplicated by opdiff's
module, and a DeprecationWarning meant for `__main__` is hidden.

So the op is called through a one-line frame that stands where the user's call stood: its code
carries the calling frame's file name and line, its globals are the calling frame's (the module
name and `__warningregistry__` that `warnings` uses). A warning, or a filter turning it into an
error, then behaves as it did without opdiff; the cost is one call and one dictionary lookup
per op. In a traceback this frame shows the user's line again, as `<opdiff call>`.

The dispatch mode (L2) needs none of this: torch emits the warnings of C++ code when the
outermost binding returns, in the frame that called it, and Python-level warnings are raised
before an op reaches the dispatcher.

    return call_as(caller, func, args, kwargs)      # caller: the frame that called the op
"""
from __future__ import annotations

import gc
import os
import sys
import types
from typing import Any, cast

import torch.overrides

CALL_NAME = "<opdiff call>"
_OVERRIDES = torch.overrides.__file__     # handle_torch_function's file
_TORCH_DIR = os.path.dirname(torch.overrides.__file__) + os.sep


def _call(func, args, kwargs): return func(*args, **kwargs)   # noqa: E704 (one line: one line number)


_TEMPLATE = _call.__code__.replace(co_name=CALL_NAME)
if hasattr(_TEMPLATE, "co_qualname"):     # Python 3.11+
    _TEMPLATE = _TEMPLATE.replace(**cast("dict[str, Any]", {"co_qualname": CALL_NAME}))
_MAX_SITES = 8192
_sites: dict = {}     # (id of caller's code, offset) -> (that code, the function calling from there)


def call_as(caller, func, args, kwargs):
    """`func(*args, **kwargs)`, called from a frame that stands in for `caller` (None: plainly)."""
    if caller is None:
        return func(*args, **kwargs)
    # Keyed by id: hashing a code object hashes its bytecode. The entry holds the code object,
    # so its id cannot be reused while the entry exists.
    entry = _sites.get((id(caller.f_code), caller.f_lasti))
    if entry is None:
        entry = _site(caller)
    return entry[1](func, args, kwargs)


def _site(caller) -> tuple:
    code = caller.f_code
    if len(_sites) >= _MAX_SITES:      # generated code (exec in a loop) must not grow this forever
        _sites.clear()
    fn = types.FunctionType(
        _TEMPLATE.replace(co_filename=code.co_filename, co_firstlineno=caller.f_lineno or 1),
        caller.f_globals)
    entry = _sites[(id(code), caller.f_lasti)] = (code, fn)
    return entry


def is_call_frame(code) -> bool:
    """True for the stand-in frame of `call_as` (frame walks looking for the user skip it)."""
    return code.co_name == CALL_NAME and code.co_code == _TEMPLATE.co_code


def api_caller():
    """The frame that called the op now in `__torch_function__` (called from there).

    A C function (`torch.add`) calls the mode itself: its caller is the mode's caller. A Python
    function (`F.softmax`) calls it through `handle_torch_function`: its caller is the frame
    above the function."""
    try:
        f = sys._getframe(2)
    except ValueError:          # called from C with no Python caller
        return None
    if f.f_code.co_filename == _OVERRIDES:
        f = f.f_back
        f = f.f_back if f is not None else None
    return f


_running: dict = {}    # id(code of a torch function) -> (that code, its function or None)


def dispatched(func):
    """The function torch is running when it hands `func` to `__torch_function__`.

    A torch function written in Python (`F.silu`) dispatches with `handle_torch_function(silu,
    ...)`, `silu` read from its module's globals. A library that replaced `F.silu` by its own
    wrapper (which calls the original) then gets its wrapper back as `func`: calling `func` from
    the mode would run the wrapper a second time, inside itself. Here the torch function whose
    frame called `handle_torch_function` is returned instead, so that user code runs exactly as
    often as without opdiff (and the op is recorded under torch's name). Called from
    `__torch_function__`; one frame lookup per call of a Python-level torch function.
    """
    code = getattr(func, "__code__", None)
    if code is None:        # a C function: it calls the mode itself
        return func
    try:
        f = sys._getframe(2)
    except ValueError:
        return func
    if f.f_code.co_filename != _OVERRIDES or f.f_back is None:
        return func
    running = f.f_back.f_code
    if running is code or code.co_filename.startswith(_TORCH_DIR) \
            or not running.co_filename.startswith(_TORCH_DIR):
        return func         # torch's own function (or dispatch helper), as torch wrote it
    entry = _running.get(id(running))
    if entry is None:
        owners = _functions_of(running)
        entry = _running[id(running)] = (running, owners[0] if len(owners) == 1 else None)
    return entry[1] if entry[1] is not None else func


def _functions_of(code) -> list:
    """The function objects running `code` (once per replaced torch function: a heap scan)."""
    def scan() -> list:
        return [o for o in gc.get_referrers(code)
                if isinstance(o, types.FunctionType) and o.__code__ is code]
    owners = scan()
    if not owners and gc.get_freeze_count():
        # objects frozen at step start (sink.py) are invisible to get_referrers
        gc.unfreeze()
        try:
            owners = scan()
        finally:
            gc.freeze()
    return owners
