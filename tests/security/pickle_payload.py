"""What the replay security tests share: a pickle whose loading creates a marker file (what a
hostile `torch.load` would run), and the CLI run as a real process with this checkout's code."""
from __future__ import annotations

from pathlib import Path

import opdiff

SRC = str(Path(opdiff.__file__).resolve().parents[1])
CLI = "import sys; from opdiff.cli import main; sys.exit(main(sys.argv[1:]))"


class Payload:
    """Unpickling this creates the marker file (what a hostile torch.load would run)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))
