"""The demo's output directory: made fresh for every demo, never at the cost of a user's files.

The demo writes through the output owner (`opdiff.report.outputs`): OUT must be new, empty, or
written by opdiff before; what an earlier demo (or compare) provably wrote there is removed, the
user's files stay, and a name the demo needs that holds a file opdiff did not write is refused.

    with workspace.hold("./opdiff-demo") as out:
        ...                                      # dumps under out/dump, reports in out
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from ..report import outputs

# The folders a demo writes besides the reports (which are declared by their own writers):
# dumps, checkpoints, monitor streams, and the trend story's op-level compare.
ENTRIES = ("dump", "checkpoint", "mon", "compare")


@contextlib.contextmanager
def hold(output) -> Iterator[Path]:
    """Hold `output` for one demo: create it (or clear an earlier run's files out of it), and
    record every file the demo writes there when the block ends.

    Raises ConfigError when `output` is a file, a non-empty directory opdiff did not write, or
    holds a `dump`, `checkpoint`, `mon` or `compare` that opdiff did not write."""
    with outputs.session(output, fresh=True) as out:
        outputs.remember(out, [out / n for n in ENTRIES])
        yield out
