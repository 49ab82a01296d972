"""Callbacks for the trainers users already have: no edit of the training loop.

    from opdiff.integrations.transformers import OpdiffCallback     # Hugging Face Trainer
    from opdiff.integrations.lightning import OpdiffCallback        # Lightning (also by entry point)

Both record the configured steps (optimizer steps, counted as the trainer counts them:
`state.global_step` / `trainer.global_step`) with one PrecisionDebugger, from the first
micro-batch of a step to the end of its optimizer step, gradient accumulation included.
`StepRecorder` is their shared part.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

log = logging.getLogger("opdiff")


class StepRecorder:
    """A PrecisionDebugger driven by a trainer's step numbers."""

    def __init__(self, dump_path: str = "./dump", steps: Optional[Iterable[int]] = (0,),
                 task: str = "statistics", level: str = "mix", **options: Any):
        from ..capture.debugger import PrecisionDebugger

        step = [] if steps is None else list(steps)
        self.dbg = PrecisionDebugger(dump_path=dump_path, task=task, level=level, step=step, **options)
        self.steps = set(step)
        self.current: Optional[int] = None       # the step being recorded

    def wanted(self, step: int) -> bool:
        return not self.steps or step in self.steps

    def begin(self, step: int, model: Any) -> None:
        """The first micro-batch of optimizer step `step` starts."""
        if self.current is not None or not self.wanted(step):
            return
        from ..errors import OpdiffError

        self.dbg.session.step_index = step
        try:
            self.dbg.start(model)
        except OpdiffError as exc:     # a trainer callback never raises into the user's loop
            log.warning("opdiff: step %s is not recorded: %s", step, exc)
            return
        self.current = step

    def end(self) -> None:
        """The optimizer step of the step being recorded is done."""
        if self.current is None:
            return
        self.current = None
        self.dbg.stop()
        self.dbg.step()


__all__ = ["StepRecorder"]
