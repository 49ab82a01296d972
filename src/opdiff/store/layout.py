"""Where things live in a dump (format v1).

    DUMP_PATH/step{S}/rank{R}/
        meta.json          format version, opdiff version, config, environment fingerprint
        records.jsonl      one op call per line, in execution order, appended and flushed
        stacks.jsonl       deduplicated call sites, referenced by id from records: {"id", "frames":
                           [{"file", "line", "function", "code"[, "context": [[n, text], ...]]}]},
                           innermost first; "context" (the innermost frame's lines around its
                           own) is optional, read by capture in the user's process
        tensors/*.safetensors   task="tensor": shards written by a background thread
        unfinished.json    only while the step is open, or when it was cut (killed, disk full):
                           see opdiff.store.durable
"""
from __future__ import annotations

import os
import re
from pathlib import Path

FORMAT_VERSION = 1
META = "meta.json"
RECORDS = "records.jsonl"
STACKS = "stacks.jsonl"
TENSORS = "tensors"
UNFINISHED = "unfinished.json"

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^rank(\d+)$")


def rank_dir(dump_path: str | os.PathLike[str], step: int, rank: int) -> Path:
    """The directory one step of one rank writes into."""
    return Path(dump_path) / f"step{step}" / f"rank{rank}"


def parse_step_rank(path: Path) -> tuple[int | None, int | None]:
    """(step, rank) read from a `.../step{S}/rank{R}` path; None where the name does not say."""
    rank_m = _RANK_RE.match(path.name)
    step_m = _STEP_RE.match(path.parent.name)
    return (int(step_m.group(1)) if step_m else None, int(rank_m.group(1)) if rank_m else None)
