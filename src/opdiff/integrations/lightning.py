"""Lightning: record the chosen optimizer steps with one callback, or with no code at all.

    from opdiff.integrations.lightning import OpdiffCallback
    trainer = lightning.Trainer(callbacks=[OpdiffCallback(dump_path="./dump/npu", steps=[0])])

or, with opdiff installed, no edit: `OPDIFF_LIGHTNING=./dump/npu python train.py`
(`OPDIFF_LIGHTNING_STEPS=0,1`, `OPDIFF_LIGHTNING_LEVEL`, `OPDIFF_LIGHTNING_TASK` optional):
opdiff's `lightning.pytorch.callbacks_factory` entry point gives every Trainer the callback.

Step S is `trainer.global_step == S`: recording starts at the first `on_train_batch_start` of
the step and ends at the `on_train_batch_end` after which global_step has advanced (the
optimizer stepped), so accumulated micro-batches are in it.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional

from lightning.pytorch.callbacks import Callback

from ..errors import ConfigError
from . import StepRecorder

ENV = "OPDIFF_LIGHTNING"


class OpdiffCallback(Callback):
    """Records steps `steps` (None: every step) into `dump_path/step{S}/rank{R}/`."""

    def __init__(self, dump_path: str = "./dump", steps: Optional[Iterable[int]] = (0,),
                 task: str = "statistics", level: str = "mix", **options: Any):
        self.recorder = StepRecorder(dump_path, steps, task, level, **options)

    from_env = False    # made by the entry point (callbacks_from_env)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.from_env and self is not _first_from_env(trainer):
            return      # opdiff installed twice on sys.path lists the entry point twice: one records
        self.recorder.begin(trainer.global_step, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        current = self.recorder.current
        if current is not None and trainer.global_step > current:
            self.recorder.end()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.recorder.end()


def callbacks_from_env() -> list:
    """The `lightning.pytorch.callbacks_factory` entry point: [OpdiffCallback] when
    OPDIFF_LIGHTNING names a dump directory, else []."""
    path = os.environ.get(ENV)
    if not path:
        return []
    steps_text = os.environ.get(f"{ENV}_STEPS", "0")
    try:
        steps = None if steps_text.strip() == "all" else \
            [int(s) for s in steps_text.replace(" ", "").split(",") if s]
    except ValueError:
        raise ConfigError(f"{ENV}_STEPS takes step numbers such as 0,1 or 'all'; got {steps_text!r}")
    callback = OpdiffCallback(dump_path=path, steps=steps,
                              task=os.environ.get(f"{ENV}_TASK", "statistics"),
                              level=os.environ.get(f"{ENV}_LEVEL", "mix"))
    callback.from_env = True
    return [callback]


def _first_from_env(trainer: Any) -> Optional[OpdiffCallback]:
    return next((c for c in getattr(trainer, "callbacks", ())
                 if isinstance(c, OpdiffCallback) and c.from_env), None)


__all__ = ["OpdiffCallback", "callbacks_from_env", "ENV"]
