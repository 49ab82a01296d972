"""Hugging Face `Trainer`: record the chosen optimizer steps with one callback.

    from opdiff.integrations.transformers import OpdiffCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[OpdiffCallback(dump_path="./dump/npu", steps=[0, 1])])

Step S is `state.global_step == S`: recording starts at `on_step_begin` (the first micro-batch
of the step) and ends at `on_step_end` (after the optimizer step), so every micro-batch of
gradient accumulation is in it. Options are PrecisionDebugger's (task, level, rank, scope, list).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from transformers import TrainerCallback

from . import StepRecorder


class OpdiffCallback(TrainerCallback):
    """Records steps `steps` (None: every step) into `dump_path/step{S}/rank{R}/`."""

    def __init__(self, dump_path: str = "./dump", steps: Optional[Iterable[int]] = (0,),
                 task: str = "statistics", level: str = "mix", **options: Any):
        self.recorder = StepRecorder(dump_path, steps, task, level, **options)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.recorder.begin(state.global_step, model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.end()      # training stopped inside a recorded step: keep what it recorded


__all__ = ["OpdiffCallback"]
