"""The output directory (`-o OUT`): the report side's name for `opdiff.outdir`, the one owner of
what opdiff writes into OUT and removes from it (see there)."""
from __future__ import annotations

from ..outdir import (LOCK, MANIFEST, OutputConflict, atomic_open, atomic_write_text, check_free,
                      make_dir, make_file, remember, session, written)

__all__ = ["MANIFEST", "LOCK", "OutputConflict", "session", "remember", "make_dir", "make_file",
           "check_free", "written", "atomic_open", "atomic_write_text"]
