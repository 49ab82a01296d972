"""torch_npu.hooks' precision compare (the PyTorch 1.8.1 era tool) on opdiff.

Change the imports, keep the script::

    from opdiff.compat.torch_npu_hooks import set_dump_path, seed_all, register_acc_cmp_hook
    from opdiff.compat.torch_npu_hooks import compare      # was torch_npu.hooks.tools

    register_acc_cmp_hook(model_cpu); register_acc_cmp_hook(model_npu); seed_all()
    set_dump_path("./cpu_resnet50_op.pkl")
    loss = criterion(model_cpu(inputs), labels); loss.backward()
    set_dump_path("./npu_resnet50_op.pkl")
    loss = criterion(model_npu(inputs), labels); loss.backward()
    compare("./npu_resnet50_op.pkl", "./cpu_resnet50_op.pkl", "./resnet50_result.csv")

Every forward of a registered model, and the backward of what it computed, is recorded with
`opdiff.PrecisionDebugger` (level "mix": modules and torch APIs, full tensors) into
`{pkl name}.opdiff/` next to the `.pkl`. The `.pkl` itself is written when the recording ends
(the next `set_dump_path`, `compare`, or the end of the process), in the tool's JSON-lines
format: `json.loads(line)` gives `[name, flat data, dtype, shape]`, names in opdiff's scheme
(`Functional.conv2d.0.forward.input.0`).

`compare` writes the tool's CSV (Name, Npu/Bench Tensor Dtype, Npu/Bench Tensor Shape, Cosine,
RMSE, MAPE) through opdiff's compare engine, and returns the full CompareResult (with
`first_divergence`). `.pkl` files written by the real torch_npu.hooks compare too.
"""
from __future__ import annotations

import atexit
import csv
import logging
import os
import weakref
from pathlib import Path

from ..errors import ConfigError
from ..store.schema import Kind
from . import legacy_files

log = logging.getLogger("opdiff")

CSV_COLUMNS = ("Name", "Npu Tensor Dtype", "Bench Tensor Dtype", "Npu Tensor Shape",
               "Bench Tensor Shape", "Cosine", "RMSE", "MAPE")


class _Recorder:
    """The current `.pkl` and the native debugger recording into its `.opdiff` folder."""

    def __init__(self):
        self.path: Path | None = None
        self.debuggers: dict = {}        # pkl path -> native PrecisionDebugger (reused on re-set)
        self.open: Path | None = None    # pkl whose step is open
        self.models: list = []           # weakrefs of registered models
        self.depth = 0
        self.warned = False

    def debugger(self, pkl: Path):
        dbg = self.debuggers.get(pkl)
        if dbg is None:
            from ..capture.debugger import PrecisionDebugger
            dbg = PrecisionDebugger(dump_path=str(pkl.with_suffix(legacy_files.HOOKS_DUMP_SUFFIX)),
                                    level="mix", task="tensor")
            self.debuggers[pkl] = dbg
        return dbg

    def pre(self, module, args):
        self.depth += 1
        if self.depth != 1:
            return      # a registered model called inside another one: already recording
        if self.path is None:
            if not self.warned:
                self.warned = True
                log.warning("opdiff: a model with register_acc_cmp_hook ran before set_dump_path(...); "
                            "nothing is recorded until a dump path is set")
            return
        try:
            self.debugger(self.path).start(module)
            self.open = self.path
        except Exception as exc:   # never break the user's forward
            log.warning("opdiff: recording did not start (%s)", exc)

    def post(self, module, args, output):
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0 and self.open is not None:
            self.debuggers[self.open].stop()     # backward of this forward is still recorded

    def finish(self) -> None:
        """End the open recording and (re)write its `.pkl`."""
        pkl, self.open = self.open, None
        if pkl is None:
            return
        dbg = self.debuggers[pkl]
        dbg.step()
        count = 0
        sidecar = pkl.with_suffix(legacy_files.HOOKS_DUMP_SUFFIX)
        try:
            count = legacy_files.write_hooks_pkl(sidecar, pkl)
        except Exception as exc:
            log.warning("opdiff: could not write %s (%s); the opdiff dump is in %s", pkl, exc, sidecar)
            return
        log.info("opdiff: wrote %d tensors to %s (opdiff dump: %s)", count, pkl, sidecar)


_recorder = _Recorder()


def _finish_at_exit() -> None:
    try:
        _recorder.finish()
    except Exception as exc:
        log.warning("opdiff: finishing the dump at exit failed (%s)", exc)


atexit.register(_finish_at_exit)


def set_dump_path(fpath=None) -> None:
    """The `.pkl` file the next forward/backward of registered models is written to."""
    if fpath is None or not str(fpath):
        raise ConfigError("set_dump_path needs a file path, e.g. set_dump_path('./cpu_module_op.pkl')")
    p = Path(os.path.abspath(fpath))   # a later chdir must not move the dump
    if p.is_dir():
        raise ConfigError(f"dump path {p} is a directory; torch_npu.hooks writes one .pkl file, "
                          f"e.g. {p / 'cpu_module_op.pkl'}")
    _recorder.finish()
    if p not in _recorder.debuggers:
        sidecar = p.with_suffix(legacy_files.HOOKS_DUMP_SUFFIX)
        if p.exists() or sidecar.exists():
            raise ConfigError(f"{p} (or {sidecar}) already exists from an earlier run; opdiff never "
                              f"appends to or overwrites a dump: remove it or choose another path")
    _recorder.path = p


def register_acc_cmp_hook(model, dump_path=None) -> None:
    """Record every forward of `model` (and its backward) into the current dump path."""
    if not hasattr(model, "named_modules"):
        raise ConfigError(f"register_acc_cmp_hook needs a torch.nn.Module; got {type(model).__name__}")
    if dump_path is not None:
        set_dump_path(dump_path)
    if any(ref() is model for ref in _recorder.models):
        return
    _recorder.models.append(weakref.ref(model))
    model.register_forward_pre_hook(_recorder.pre)
    model.register_forward_hook(_recorder.post, always_call=True)


def seed_all(seed: int = 1234, mode: bool = False) -> None:
    """Seed every random generator (opdiff.seed_all); `mode=True` also asks for deterministic kernels."""
    from ..seeding import seed_all as native_seed_all
    native_seed_all(seed, deterministic=bool(mode))


def _side(pkl_path) -> str:
    p = Path(pkl_path)
    if not p.exists():
        raise ConfigError(f"{p} does not exist; pass the .pkl files set_dump_path wrote")
    own = legacy_files.dump_for_pkl(p)
    return str(own if own is not None else p)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _dtype(value) -> str:
    if not value:
        return ""
    return value if value.startswith("torch.") else f"torch.{value}"


def _check_output(out: Path) -> None:
    """Replace only an earlier result of this compare; never another file of the user's."""
    if out.is_dir():
        raise ConfigError(f"{out} is a directory; give the .csv file to write, e.g. {out / 'result.csv'}")
    if out.exists():
        with open(out, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
        if tuple(header or ()) != CSV_COLUMNS:
            raise ConfigError(f"{out} exists and is not an earlier compare result; choose another file name")


def compare(pkl_path1, pkl_path2, output_path, shape_flag: bool = False):
    """Compare npu (`pkl_path1`, target) with bench (`pkl_path2`, golden); write the CSV.

    shape_flag=False pairs ops by name; True by name and tensor shapes. Returns the CompareResult.
    """
    out = Path(output_path)
    _check_output(out)
    _recorder.finish()     # the script may compare right after its last backward
    target, golden = _side(pkl_path1), _side(pkl_path2)
    from ..api import compare as engine_compare
    result = engine_compare(target, golden, shape_flag=bool(shape_flag))
    # The tool's CSV held op tensors only: not the leaves opdiff checks before them.
    rows = [r for r in result.rows if r.target_name and r.golden_name and r.kind != Kind.LEAF]
    from ..report.csv_report import safe_writer

    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = safe_writer(f)           # op names from the dump: no formulas
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([r.target_name, _dtype(r.target_dtype), _dtype(r.golden_dtype),
                        list(r.target_shape or ()), list(r.golden_shape or ()),
                        _cell(r.metrics.get("Cosine")), _cell(r.metrics.get("RMSE")),
                        _cell(r.metrics.get("MAPE"))])
    tmp.replace(out)
    unmatched = sum(1 for r in result.rows if not (r.target_name and r.golden_name))
    if unmatched:
        log.info("opdiff: %d tensors had no partner on the other side and are not in %s", unmatched, out)
    return result
