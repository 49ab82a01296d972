"""opdiff.Monitor: cheap numbers from every training step, for thousands of steps.

    mon = opdiff.Monitor(model, "./mon/npu", optimizer=opt)
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y); loss.backward(); opt.step()
        mon.step(loss)                  # after optimizer.step(), before zero_grad()
        opt.zero_grad()
    mon.close()

then `opdiff trend ./mon/npu ./mon/gpu -o out`. See opdiff.monitor for what is recorded.
"""
from __future__ import annotations

import logging
import math
import os
import time
from datetime import datetime, timezone
from typing import Optional

import numpy as np
import torch

from .. import __version__
from ..errors import ConfigError, OverflowDetected
from ..store.records import SCHEMA_VERSION
from .modules import ModuleProbe
from .parameters import ParameterProbe
from .stream import FORMAT, MODULE_QUANTITIES, STEP_COLUMNS, VERSION, StreamWriter, column, \
    rank_directory, read_meta
from .tensorboard import TensorBoardExport

log = logging.getLogger("opdiff")

_LOW_PRECISION = {"bfloat16": 0, "float16": 1, "float32": 2, "float64": 3}


def _distributed_rank() -> tuple[int, int]:
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Monitor:
    """Record loss, gradient norm, per-module activations and gradients, and per-parameter
    norms, updates and optimizer state at every `every`-th step, into `path/rank{R}/`.

    model: the nn.Module to watch (hooks go on its submodules; the model is held weakly).
    path: the stream's root directory; each rank writes `path/rank{R}/meta.json` and
        `metrics.csv` (rank from torch.distributed when it is initialised, or `rank=`).
    optimizer: gives update norms and optimizer-state norms (optional).
    scaler: a torch.amp.GradScaler: its loss scale is recorded and gradients are unscaled.
    every: record every N-th step (the others cost one flag check per module).
    modules: qualified names or fnmatch globs of the modules to watch ("blocks.*.mlp");
        default: every submodule that is called.
    update_norm: measure ||param after step - param before|| (one copy of the parameters).
    raise_on_nan: raise opdiff.OverflowDetected at the first module whose output or output
        gradient holds inf/NaN (a device sync per module on GPU/NPU; free on CPU).
    tensorboard: also write the numbers as TensorBoard scalars (`pip install tensorboard`).
    flush_every: flush the stream every N recorded steps (1: a killed run loses nothing).
    resume_from: continue the stream already in `path` (a run restarted from a checkpoint):
        the first `step()` ends step `resume_from`; the stream's rows from that step on (what
        the killed run recorded after the checkpoint) are dropped and the rest kept, so every
        step is in it once. Without it, an existing stream is replaced.

    The monitor never changes what the user computes (reductions run without gradients, touch
    no random generator and no tensor of the user's), and never raises into the training loop
    except for raise_on_nan: a failure of its own is logged once and recording stops.
    """

    def __init__(self, model: torch.nn.Module, path: "str | os.PathLike", optimizer=None, *,
                 scaler=None, every: int = 1, modules=None, update_norm: bool = True,
                 raise_on_nan: bool = False, tensorboard: bool = False,
                 rank: Optional[int] = None, flush_every: int = 1,
                 resume_from: Optional[int] = None):
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"Monitor needs the nn.Module to watch; got {type(model).__name__}")
        for name, value in (("every", every), ("flush_every", flush_every)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Monitor '{name}' must be a positive integer; got {value!r}")
        if resume_from is not None and (not isinstance(resume_from, int) or
                                        isinstance(resume_from, bool) or resume_from < 0):
            raise ConfigError(f"Monitor 'resume_from' must be a step number (an integer >= 0); "
                              f"got {resume_from!r}")
        optimizer = unwrap_optimizer(optimizer)
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"Monitor 'optimizer' must be a torch.optim.Optimizer; got "
                              f"{type(optimizer).__name__}")
        detected_rank, self.world_size = _distributed_rank()
        self.rank = detected_rank if rank is None else int(rank)
        self.every = every
        self.scaler = scaler
        self.directory = rank_directory(path, self.rank)
        try:
            self._writer = StreamWriter(self.directory, flush_every)
        except OSError as exc:
            raise ConfigError(f"Monitor cannot create {self.directory}: {exc.strerror}") from None
        self._columns: Optional[list] = None
        self._earlier: Optional[dict] = None     # meta.json of the stream a resume continues
        self._checked_columns = False
        if resume_from is None:
            if (self.directory / "metrics.csv").exists():
                log.warning("opdiff: Monitor replaces the stream in %s", self.directory)
        else:
            self._resume(resume_from)
        self._tensorboard = TensorBoardExport(self.directory) if tensorboard else None
        if self._tensorboard is not None and self._columns is not None:
            self._tensorboard.columns(self._columns)
            self._tensorboard.restart(resume_from or 0)
        self._modules = ModuleProbe(model, modules, raise_on_nan=raise_on_nan,
                                    on_error=self._failed)
        if not self._modules.names:
            raise ConfigError(f"Monitor: no module of the model matches modules={modules!r}")
        self._params = ParameterProbe(model, optimizer, update_norm=update_norm,
                                      on_error=self._failed)
        self.raise_on_nan = raise_on_nan
        self._config = {"every": every, "modules": modules, "update_norm": self._params.update_norm,
                        "raise_on_nan": raise_on_nan, "flush_every": flush_every,
                        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
                        "optimizer_defaults": _plain_defaults(optimizer),
                        "scaler": scaler is not None, "model": type(model).__name__}
        self._scale: Optional[torch.Tensor] = None
        self._broken = False
        self._closed = False
        self._last_time = time.perf_counter()
        self._step = resume_from or 0
        self._meta_written = False
        self._write_meta()
        self._modules.install()
        self._arm()

    # -- the user's verbs ------------------------------------------------------------------------
    @property
    def current_step(self) -> int:
        """The step the next `step()` call ends (0 for the first)."""
        return self._step

    def step(self, loss=None) -> None:
        """End the current step: measure what it did, append one line, flush. Call it after
        optimizer.step() (or scaler.step/update) and before zero_grad(). `loss` may be a tensor
        or a number (tensors stay on the device until the step's single transfer)."""
        if self._closed:
            return
        try:
            if self._modules.recording and not self._broken:
                self._record(loss)
        except OverflowDetected:
            raise
        except Exception as exc:
            self._failed("step()", exc)
        finally:
            self._step += 1
            self._arm()

    def close(self) -> None:
        """Flush and close the stream and remove every hook (also on `with Monitor(...)` exit)."""
        if self._closed:
            return
        self._closed = True
        self._modules.recording = self._params.recording = False
        self._modules.remove()
        self._params.remove()
        try:
            self._writer.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
        except Exception as exc:
            self._failed("close()", exc)

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _resume(self, start: int) -> None:
        earlier = read_meta(self.directory)
        try:
            columns = self._writer.reopen(start) if earlier is not None else None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"Monitor cannot resume the stream in {self.directory}: "
                              f"{exc}") from None
        if earlier is None or columns is None:
            log.warning("opdiff: Monitor(resume_from=%d) found no recorded step in %s; it "
                        "starts the stream", start, self.directory)
            return
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        earlier["resumed"] = list(earlier.get("resumed") or []) + [
            {"step": start, "at": now, "kept_rows": self._writer.kept_rows}]
        self._earlier = earlier
        self._columns = columns
        self._forward_order = [m["name"] for m in earlier.get("modules") or []]
        self._backward_order = list(earlier.get("backward_order") or [])

    # -- one recorded step ----------------------------------------------------------------------
    def _arm(self) -> None:
        """Turn the hooks on for the coming step when it is one to record."""
        on = not self._broken and not self._closed and self._step % self.every == 0
        self._modules.clear()
        self._params.clear()
        self._modules.recording = self._params.recording = on
        self._modules.step = self._step
        self._scale = None
        if on and self.scaler is not None:
            self._modules.on_first_backward = self._snapshot_scale

    def _snapshot_scale(self) -> None:
        # The scale the gradients carry is the one before scaler.update() changes it.
        scale = getattr(self.scaler, "_scale", None)
        if isinstance(scale, torch.Tensor):
            self._scale = scale.detach().reshape(()).float().clone()

    def _record(self, loss) -> None:
        now = time.perf_counter()
        step_time, self._last_time = now - self._last_time, now
        head: list = []
        loss_value = None
        with torch.no_grad():
            if isinstance(loss, torch.Tensor):
                head.append(loss.detach().float().mean().reshape(()))
            elif loss is not None:
                loss_value = float(loss)
            if self._scale is not None:
                head.append(self._scale)
            module_tensors = self._modules.pending()
            host = _to_host(head + module_tensors + self._params.pending())
        pos = 0
        if isinstance(loss, torch.Tensor):
            loss_value, pos = host[0], 1
        scale = None
        if self._scale is not None:
            scale, pos = host[pos], pos + 1
        elif self.scaler is not None and hasattr(self.scaler, "get_scale"):
            scale = float(self.scaler.get_scale())
        n_modules = len(module_tensors)
        values = self._modules.finish(host[pos:pos + n_modules], loss_scale=scale)
        param_values, grad_norm = self._params.finish(host[pos + n_modules:])
        values.update(param_values)
        values["loss"] = loss_value          # None: not given, left empty in the stream
        values["grad_norm"] = grad_norm
        values["loss_scale"] = scale
        values["lr"] = _learning_rate(self._params.optimizer)
        values["step_time"] = step_time
        if self.raise_on_nan:
            self._check_finite(values)
        self._write(values)

    def _check_finite(self, values: dict) -> None:
        if values["loss"] is not None and not math.isfinite(values["loss"]):
            raise OverflowDetected(f"opdiff monitor: the loss is {values['loss']} at step "
                                   f"{self._step} while every monitored module output was finite")
        if self.scaler is None and values["grad_norm"] is not None and \
                not math.isfinite(values["grad_norm"]):
            raise OverflowDetected(f"opdiff monitor: the gradient norm is {values['grad_norm']} "
                                   f"at step {self._step}")

    def _write(self, values: dict) -> None:
        if self._columns is None:
            self._columns = self._layout(values)
            self._writer.open(self._columns)
            if self._tensorboard is not None:
                self._tensorboard.columns(self._columns)
            self._write_meta()
            extra = sorted(set(values) - set(self._columns))
            if extra:
                log.info("opdiff: Monitor ignores %d values without a column", len(extra))
        elif self._earlier is not None and not self._checked_columns:
            self._checked_columns = True
            if self._layout(values) != self._columns:
                log.warning("opdiff: the resumed run measures other columns than the stream in "
                            "%s holds; values are written by column name (the others left "
                            "empty or dropped)", self.directory)
        get = values.get
        found = [get(col) for col in self._columns]
        missing = None
        if None in found:       # not measured this step: left empty in the stream
            missing = np.array([v is None for v in found])
            found = [0.0 if v is None else v for v in found]
        row = np.array(found, dtype=np.float64)
        self._writer.append(self._step, row, missing)
        if self._tensorboard is not None:
            self._tensorboard.write(self._step, row.tolist())

    def _layout(self, values: dict) -> list:
        """Columns, fixed at the first recorded step: modules in the order they returned."""
        cols = [c for c in STEP_COLUMNS if values.get(c) is not None]
        order = self._modules.forward.order + [i for i in self._modules.backward.order
                                               if i not in self._modules.forward.acc]
        for idx in order:
            name = self._modules.names[idx]
            cols.extend(c for c in (column(name, q) for q in MODULE_QUANTITIES) if c in values)
        cols.extend(c for c in self._params.columns if c in values)
        self._forward_order = [self._modules.names[i] for i in self._modules.forward.order]
        self._backward_order = [self._modules.names[i] for i in self._modules.backward.order]
        return cols

    def _write_meta(self) -> None:
        if self._earlier is not None and self._columns is not None:
            self._writer.write_meta(self._earlier)
            return
        modules = []
        if self._columns is not None:
            index = {n: i for i, n in enumerate(self._modules.names)}
            for name in self._forward_order:
                i = index[name]
                modules.append({"name": name, "type": self._modules.types[i],
                                "dtype": self._modules.dtypes.get(i)})
        dtypes = [m["dtype"] for m in modules if m["dtype"] in _LOW_PRECISION]
        params = [{"name": n, "dtype": str(p.dtype).replace("torch.", ""), "shape": list(p.shape),
                   "updated": i in set(self._params.updated)}
                  for i, (n, p) in enumerate(zip(self._params.names, self._params.params))]
        from ..environment import fingerprint

        meta = {
            "format": FORMAT, "version": VERSION, "schema_version": SCHEMA_VERSION, "opdiff": __version__,
            "rank": self.rank, "world_size": self.world_size,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": self._config,
            "environment": fingerprint(),
            "compute_dtype": min(dtypes, key=_LOW_PRECISION.get) if dtypes else None,  # type: ignore[arg-type]  # .get: every dtype here is a key
            "modules": modules,
            "backward_order": getattr(self, "_backward_order", []),
            "parameters": params,
            "columns_written": self._columns is not None,
        }
        self._writer.write_meta(meta)

    def _failed(self, where: str, exc: BaseException) -> None:
        """Log once, stop recording, let the training go on."""
        if not self._broken:
            log.warning("opdiff: Monitor stopped recording after an error in %s: %s: %s "
                        "(training is not affected; the stream keeps the steps before)",
                        where, type(exc).__name__, exc)
        self._broken = True
        self._modules.recording = self._params.recording = False


def _to_host(tensors: list) -> list:
    """Python floats of the step's 0-d tensors: read directly on CPU (a read there is free,
    cheaper than stacking them), one transfer per device elsewhere."""
    if not tensors:
        return []
    if all(t.is_cpu for t in tensors):
        return [t.item() for t in tensors]
    out: list = [None] * len(tensors)
    by_device: dict = {}
    for i, t in enumerate(tensors):
        if t.is_cpu:
            out[i] = t.item()
        else:
            by_device.setdefault(t.device, []).append(i)
    for idxs in by_device.values():
        stacked = torch.stack([tensors[i] if tensors[i].dtype == torch.float32 else
                               tensors[i].float() for i in idxs])
        for i, v in zip(idxs, stacked.tolist()):
            out[i] = v
    return out


# Where optimizer wrappers keep the optimizer they wrap: Lightning's LightningOptimizer
# (`_optimizer`), Accelerate's AcceleratedOptimizer (as Hugging Face's Trainer hands it out) and
# DeepSpeed's ZeRO optimizers (`optimizer`).
_WRAPPED = ("_optimizer", "optimizer")


def unwrap_optimizer(optimizer):
    """The torch optimizer inside any wrappers: a wrapper may pass for a torch.optim.Optimizer
    (Accelerate's and Lightning's do) without its hooks, so hooks go on the wrapped one, whose
    step() the wrapper calls."""
    seen = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        inner = None
        for attr in _WRAPPED:
            try:
                candidate = getattr(optimizer, attr, None)
            except Exception:        # (a wrapper whose attribute lookup itself fails)
                candidate = None
            if candidate is not None and candidate is not optimizer and hasattr(
                    candidate, "param_groups"):
                inner = candidate
                break
        if inner is None:
            break
        optimizer = inner
    return optimizer


def _learning_rate(optimizer) -> Optional[float]:
    """The first parameter group's learning rate (a float or a 0-d tensor), None without one."""
    try:
        lr = optimizer.param_groups[0]["lr"] if optimizer is not None else None
        return float(lr) if lr is not None else None
    except Exception:          # (an optimizer without param groups or lr: no column)
        return None


def _plain_defaults(optimizer) -> Optional[dict]:
    if optimizer is None:
        return None
    return {k: v for k, v in optimizer.defaults.items()
            if isinstance(v, (int, float, bool, str)) or v is None}
