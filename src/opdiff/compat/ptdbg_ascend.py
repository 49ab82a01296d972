"""ptdbg_ascend's API on opdiff: change the import line, keep the rest of the script.

    from opdiff.compat.ptdbg_ascend import register_hook, overflow_check, seed_all, \\
        set_dump_path, set_dump_switch, acc_cmp_dump, compare, PrecisionDebugger

Hook style (ptdbg_ascend 3.x/4.x)::

    seed_all()
    set_dump_path("./dump_data_new/npu")
    register_hook(model, acc_cmp_dump)
    set_dump_switch("ON")                 # everything until OFF is recorded ...
    for epoch in ...: train(...)
    set_dump_switch("OFF")                # ... as one step: step0, the next ON..OFF is step1

Debugger style (ptdbg_ascend 4.x)::

    debugger = PrecisionDebugger(dump_path="./dump_data_new/npu", hook_name="dump", step=[0])
    debugger.configure_hook(mode="api_stack")
    debugger.start(); ...; debugger.stop(); debugger.step()

Both record with `opdiff.PrecisionDebugger` into ptdbg_ascend's layout,
`dump_path/{dump_tag}_v4.0/step{S}/rank{R}/`: the opdiff dump (records.jsonl, stacks.jsonl,
tensors/) plus `{mode_}dump.pkl` and `{mode_}dump/` as ptdbg_ascend named them. Modes other
than the whole-network ones ("all", "api_stack") get their own folder below `v4.0/` (for
example `v4.0/stack/step0/rank0/stack_dump.pkl`), so rerunning a script with only the
`set_dump_switch` line changed never collides with the first run.

`compare(dump_result_param, out)` takes the seed's dictionary and runs opdiff's compare on the
dumps those `.pkl` files belong to (or on the `.pkl` files themselves when a real ptdbg_ascend
wrote them), writing `compare_result_{timestamp}.csv` into `out`.

Legacy underscore names (`Tensor___iadd___forward`, `Tensor_permute_1_forward`) are accepted
wherever names are. `set_dump_switch("ON", mode="stack", scope=[...])` records only the call
sites of the named APIs: `stack.json` and `stack_dump.pkl` in the step directory say which file,
line and code each call came from.
"""
from __future__ import annotations

import atexit
import logging
import os
import weakref
from pathlib import Path

from ..errors import ConfigError
from . import legacy_files
from .ptdbg_modes import (LEGACY_VERSION, Run, check_fresh, data_mode, dump_base, selection,
                          warn_once)

log = logging.getLogger("opdiff")

# -- the two hook kinds register_hook accepts -------------------------------------------------
def acc_cmp_dump(*args, **kwargs):
    """Marker for `register_hook(model, acc_cmp_dump)`: record data for compare."""
    raise ConfigError("acc_cmp_dump is not called directly; use register_hook(model, acc_cmp_dump)")


def overflow_check(*args, **kwargs):
    """Marker for `register_hook(model, overflow_check, overflow_nums=1)`: find inf/NaN origins."""
    raise ConfigError("overflow_check is not called directly; use register_hook(model, overflow_check)")


def seed_all(seed: int = 1234, mode: bool = False) -> None:
    """ptdbg_ascend's seed_all: `mode=True` also asks for deterministic kernels (opdiff.seed_all)."""
    from ..seeding import seed_all as native_seed_all
    native_seed_all(seed, deterministic=bool(mode))


# -- hook style --------------------------------------------------------------------------------
class _HookStyle:
    """State behind set_dump_path / register_hook / set_dump_switch (one per process, as in ptdbg)."""

    def __init__(self):
        self.dump_path = None
        self.tag = "ptdbg_dump"
        self.model = None           # weakref to the registered model
        self.hook = None
        self.overflow_nums = 1
        self.runs: dict = {}        # root -> Run
        self.region: Run | None = None
        self.watch: Run | None = None    # overflow_check: recording around each forward
        self.handles: list = []
        self.depth = 0

    def finish(self) -> None:
        """Close whatever is open and write its files (OFF, a new path, or the end of the process)."""
        if self.region is not None:
            self.region.step()
            self.region = None
        if self.watch is not None:
            self.watch.step()
            self.watch = None
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def run_for(self, mode: str, native: dict) -> Run:
        base = dump_base(self.dump_path, self.tag)
        run = self.runs.get((base, mode, native.get("task")))
        if run is None:
            run = Run(base, mode, "mix", native)
            check_fresh(run.root)
            self.runs[(base, mode, native.get("task"))] = run
        return run

    # overflow_check records around every forward of the registered model, so it needs no switch
    def _pre(self, module, args):
        self.depth += 1
        if self.depth == 1 and self.region is None and self.watch is not None:
            try:
                self.watch.start(module)
            except Exception as exc:    # never break the user's forward
                warn_once("watch", "overflow check did not start (%s)", exc)

    def _post(self, module, args, output):
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0 and self.region is None and self.watch is not None:
            self.watch.stop()
            if self.watch.closed_early:     # OverflowDetected is on its way to the user
                self.watch.step()


_hooks = _HookStyle()
atexit.register(lambda: _safe_finish(_hooks))


def _safe_finish(state) -> None:
    try:
        state.finish()
    except Exception as exc:
        log.warning("opdiff: finishing the dump at exit failed (%s)", exc)


def set_dump_path(fpath=None, dump_tag: str = "ptdbg_dump") -> None:
    """Where dumps go: `fpath/{dump_tag}_v4.0/step{S}/rank{R}/`. Closes a dump still open."""
    if fpath is None:
        raise ConfigError("set_dump_path needs a directory, e.g. set_dump_path('./dump_data/npu')")
    if not isinstance(dump_tag, str) or not dump_tag or os.sep in dump_tag:
        raise ConfigError(f"dump_tag must be a folder name such as 'npu_overflow'; got {dump_tag!r}")
    dump_base(fpath, dump_tag)
    _hooks.finish()
    _hooks.runs.clear()
    _hooks.dump_path, _hooks.tag = str(fpath), dump_tag


def register_hook(model, hook, overflow_nums: int = 1, dump_mode=None, dump_config=None, **kwargs) -> None:
    """Attach `acc_cmp_dump` (switch on with set_dump_switch) or `overflow_check` (always on)."""
    if not hasattr(model, "named_modules"):
        raise ConfigError(f"register_hook needs a torch.nn.Module; got {type(model).__name__}")
    if hook not in (acc_cmp_dump, overflow_check):
        raise ConfigError("register_hook's second argument must be acc_cmp_dump or overflow_check "
                          "(import them from opdiff.compat.ptdbg_ascend)")
    if dump_mode == "acl" or dump_config is not None:
        warn_once("acl", "ACL dumps (dump_mode='acl', dump_config) exist only on Ascend; opdiff "
                   "records the APIs at the torch level instead")
    for key in kwargs:
        warn_once(f"hook:{key}", "register_hook option %r has no effect in opdiff", key)
    _hooks.finish()
    _hooks.model = weakref.ref(model)
    _hooks.hook = hook
    _hooks.overflow_nums = overflow_nums
    if hook is overflow_check:
        _hooks.watch = _hooks.run_for("all", {"task": "overflow_check", "overflow_nums": overflow_nums})
        _hooks.handles = [model.register_forward_pre_hook(_hooks._pre),
                          model.register_forward_hook(_hooks._post, always_call=True)]


def set_dump_switch(switch: str, mode: str = "all", scope=None, api_list=None, filter_switch=None,
                    dump_mode=None) -> None:
    """Start ("ON") or end ("OFF") recording. Each ON..OFF region is one step of the dump.

        set_dump_switch("ON", mode="stack", scope=["Tensor___iadd___forward"])   # call sites only
    """
    if switch not in ("ON", "OFF"):
        raise ConfigError(f"set_dump_switch takes 'ON' or 'OFF'; got {switch!r}")
    if switch == "OFF":
        if _hooks.region is not None:
            _hooks.region.stop()
            _hooks.region.step()
            _hooks.region = None
        return
    if _hooks.model is None or _hooks.model() is None:
        raise ConfigError("call register_hook(model, acc_cmp_dump) before set_dump_switch('ON')")
    if _hooks.region is not None:
        return
    if filter_switch not in (None, "ON", "OFF"):
        raise ConfigError(f"filter_switch must be 'ON' or 'OFF'; got {filter_switch!r}")
    if filter_switch is not None:
        warn_once("filter_switch", "filter_switch is accepted and ignored: opdiff records every "
                   "argument, integers and bools as plain values next to the tensors")
    native = selection(mode, scope, api_list)
    native["data_mode"] = data_mode(dump_mode)
    if _hooks.hook is overflow_check:
        native.update(task="overflow_check", overflow_nums=_hooks.overflow_nums)
    run = _hooks.run_for(mode or "all", native)
    run.start(_hooks.model())
    _hooks.region = run


# -- debugger style -----------------------------------------------------------------------------
class _EitherCall:
    """Let `PrecisionDebugger.start()` act on the last debugger made, as ptdbg_ascend allowed."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls):
        if obj is not None:
            return self.fn.__get__(obj, cls)

        def on_current(*args, **kwargs):
            if cls._current is None:
                raise ConfigError(f"create a PrecisionDebugger(dump_path=...) before calling "
                                  f"PrecisionDebugger.{self.fn.__name__}()")
            return self.fn(cls._current, *args, **kwargs)
        return on_current


class PrecisionDebugger:
    """ptdbg_ascend 4.x's debugger: `hook_name` "dump" or "overflow_check", `step`, `rank`.

        debugger = PrecisionDebugger(dump_path="./dump_data_new/npu", hook_name="dump", step=[0])
        debugger.configure_hook(mode="api_stack")
        debugger.start(); ...; debugger.stop(); debugger.step()

    Records torch API calls (level L1; pass `model=` to also record modules) into
    `dump_path/ptdbg_dump_v4.0/step{S}/rank{R}/`, with `api_stack_dump.pkl` beside the dump.
    """

    _current: "PrecisionDebugger | None" = None

    def __init__(self, dump_path=None, hook_name=None, rank=None, step=None, enable_dataloader=False,
                 model=None, **kwargs):
        if hook_name not in ("dump", "overflow_check"):
            raise ConfigError(f"hook_name must be 'dump' or 'overflow_check'; got {hook_name!r}")
        if enable_dataloader:
            warn_once("dataloader", "enable_dataloader is not supported: call debugger.start(), "
                       "debugger.stop() and debugger.step() around each step instead")
        for key in kwargs:
            warn_once(f"dbg:{key}", "PrecisionDebugger option %r has no effect in opdiff", key)
        self.base = dump_base(dump_path, "ptdbg_dump")
        self.hook_name = hook_name
        self.rank = [rank] if isinstance(rank, int) else rank
        self.steps = step
        self.model = model
        self.mode = "api_stack"
        self.native = {"task": "overflow_check"} if hook_name == "overflow_check" \
            else selection("api_stack", None, None)
        self.run: Run | None = None
        PrecisionDebugger._current = self
        atexit.register(lambda: _safe_finish(self))

    def configure_hook(self, mode="api_stack", scope=None, api_list=None, filter_switch="OFF",
                       acl_config=None, backward_input=None, input_output_mode=None,
                       summary_only=False, overflow_nums=1, need_replicate=False) -> None:
        """Choose what to record; call before the first start(). Modes as in set_dump_switch."""
        if self.run is not None:
            raise ConfigError("call configure_hook before the first debugger.start()")
        if self.hook_name == "overflow_check":
            self.mode = "all"
            self.native = {"task": "overflow_check", "overflow_nums": overflow_nums}
        else:
            self.mode = mode or "api_stack"
            self.native = selection(self.mode, scope, api_list)
            if summary_only:
                self.native["task"] = "statistics"
            self.native["data_mode"] = data_mode(input_output_mode)
        if acl_config is not None:
            warn_once("acl", "acl_config (ACL operator dumps) exists only on Ascend; opdiff "
                       "records the APIs at the torch level instead")
        if backward_input:
            warn_once("backward_input", "backward_input is not needed: opdiff records backward "
                       "inputs and outputs of every API during the run")
        if need_replicate:
            warn_once("replicate", "need_replicate has no effect: opdiff records the overflowing op's "
                       "full tensors so it can be replayed from the dump")

    @_EitherCall
    def start(self, model=None) -> None:
        """Begin or resume recording the current step."""
        model = model if model is not None else self.model
        if self.run is None:
            self.run = Run(self.base, self.mode, "mix" if model is not None else "L1",
                            dict(self.native, step=self.steps, rank=self.rank))
            check_fresh(self.run.root)
        self.run.start(model)

    @_EitherCall
    def stop(self) -> None:
        """Pause recording (backward of the recorded forward is still recorded until step())."""
        if self.run is not None:
            self.run.stop()

    @_EitherCall
    def step(self) -> None:
        """End the step: write the dump and its `.pkl`; counters restart for the next step."""
        if self.run is not None:
            self.run.step()

    def finish(self) -> None:
        if self.run is not None and self.run.dbg.dump_dir is not None:
            self.run.step()


# -- compare -------------------------------------------------------------------------------------


def _side(param: dict, which: str) -> str:
    pkl = param.get(f"{which}_pkl_path")
    data = param.get(f"{which}_dump_data_dir")
    if not pkl and not data:
        raise ConfigError(f"dump_result_param needs '{which}_pkl_path' (the dump.pkl written under "
                          f"set_dump_path's directory)")
    if pkl:
        p = Path(pkl)
        if not p.exists():
            raise ConfigError(f"{which}_pkl_path {p} does not exist; point it at the dump.pkl in "
                              f"<dump_path>/ptdbg_dump_{LEGACY_VERSION}/step0/rank0/")
        own = legacy_files.dump_for_pkl(p)
        return str(own if own is not None else p)
    return str(data)


def compare(input_param: dict, output_path, stack_mode: bool = False, auto_analyze: bool = True,
            suffix: str = "", fuzzy_match: bool = False, **kwargs):
    """Compare the npu (target) and bench (golden) dumps named in the seed's dictionary.

        compare({"npu_pkl_path": ".../npu/.../dump.pkl", "bench_pkl_path": ".../cpu/.../dump.pkl",
                 "npu_dump_data_dir": ".../npu/.../dump", "bench_dump_data_dir": ".../cpu/.../dump"},
                "./out", stack_mode=True)

    Writes `compare_result_{timestamp}.csv` (with a Stack column), summary.json and report.html
    into `output_path`, and returns the CompareResult.
    """
    if not isinstance(input_param, dict):
        raise ConfigError("compare's first argument is a dict with npu_pkl_path, bench_pkl_path, "
                          "npu_dump_data_dir and bench_dump_data_dir")
    if fuzzy_match:
        warn_once("fuzzy", "fuzzy_match is not needed: opdiff aligns ops by name and order and "
                   "reports unmatched ones")
    target, golden = _side(input_param, "npu"), _side(input_param, "bench")
    from ..api import compare as engine_compare
    return engine_compare(target, golden, output_path=str(output_path))
