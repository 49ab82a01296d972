"""The Monitor's optional TensorBoard export: every recorded step as one event holding all of its
scalars (tags `blocks.7.mlp/fwd_norm`, `loss`, ...), under `MON_PATH/rank{R}/tensorboard/`.

One event per step, not one `SummaryWriter.add_scalar` call per column: a transformer's ~800
columns cost ~25 ms a step through add_scalar and ~2 ms as one event, the same file for
TensorBoard (legacy `simple_value` scalars, which is what add_scalar writes too).
"""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import ConfigError


class TensorBoardExport:
    """Scalars of the stream's columns (not the NaN/inf counts), one event per recorded step."""

    def __init__(self, directory: Path):
        try:
            from tensorboard.compat.proto.summary_pb2 import Summary
            from torch.utils.tensorboard.writer import FileWriter
        except ImportError:
            raise ConfigError("Monitor(tensorboard=True) needs the tensorboard package: "
                              "pip install 'opdiff[monitor]' (or pip install tensorboard)") from None
        self._summary = Summary
        self._writer = FileWriter(str(directory / "tensorboard"))
        self._tags: list = []       # (position in the row, tag)

    def columns(self, columns: list) -> None:
        """The stream's columns, fixed at the first recorded step."""
        self._tags = [(i, col.replace(":", "/")) for i, col in enumerate(columns)
                      if not col.endswith(("_nan", "_inf"))]

    def restart(self, step: int) -> None:
        """A resumed run: TensorBoard drops the earlier files' points from `step` on."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        self._writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))

    def write(self, step: int, row: list) -> None:
        """One step's values, in the order of `columns`; non-finite ones are left out."""
        value = self._summary.Value
        values = [value(tag=tag, simple_value=v) for i, tag in self._tags
                  if math.isfinite(v := row[i])]
        self._writer.add_summary(self._summary(value=values), step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
