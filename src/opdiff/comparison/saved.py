"""A saved tensor of a dump, read for a comparison: in the shape its record gives it, or None
(with the reason noted) where its file cannot be read, so that its statistics are compared."""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from ..errors import OpdiffError
from ..store.source import DumpSource
from .reasons import unread_note
from ..store.schema import Descriptor

log = logging.getLogger("opdiff")


def numel(shape: Optional[Sequence[int]]) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n


def load_saved(dump: DumpSource, desc: Descriptor, unread: Optional[list[str]] = None) -> Any:
    key = desc.get("key")
    if not key:
        return None
    try:
        found = dump.tensor(key)
        # a compiled module call's boundary tensor, saved with its leading or trailing
        # dimensions merged (compiled_modules.py): the same elements, in the module's shape
        if desc.get("saved_shape") is not None and found is not None and \
                found.numel() == numel(desc.get("shape")):
            found = found.reshape(desc["shape"])
        return found
    except OpdiffError:
        raise
    except Exception as exc:  # an unreadable shard or file: compare the statistics instead
        log.warning("opdiff: cannot read tensor %s from %s (%s); using its statistics", key,
                    getattr(dump, "path", "?"), exc)
        if unread is not None:   # the row says so too
            unread.append(unread_note(key, exc))
        return None


__all__ = ["load_saved", "numel"]
