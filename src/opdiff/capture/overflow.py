"""task="overflow_check": catch the op where inf/NaN is born, online.

Every op's outputs (forward) or input-gradients (backward) are checked for non-finite values
with one reduction and one host transfer per op. An op whose outputs are non-finite while its
inputs are all finite *created* the overflow: it is written to the dump with full tensors, its
module and the user's source line. Ops that only pass inf/NaN along are counted. After
`overflow_nums` origins (-1: never), training stops with `OverflowDetected`.
"""
from __future__ import annotations

import logging

import torch

from ..errors import OverflowDetected
from .describe import tensors_in

log = logging.getLogger("opdiff")


def all_finite(values) -> bool:
    """True when every floating tensor in values is free of inf/NaN (one transfer for all)."""
    flags = [torch.isfinite(t).all() for t in tensors_in(values)
             if (t.is_floating_point() or t.is_complex()) and t.numel() and not t.is_meta]
    if not flags:
        return True
    return bool(torch.stack(flags).all().item())


class OverflowMonitor:
    """Per-session overflow state: origins found, ops that propagated inf/NaN."""

    def __init__(self, session, describer):
        self.session = session
        self.describer = describer      # saves full tensors for the origin records
        self.origins: list[dict] = []
        self.propagated = 0

    def check(self, record: dict, inputs, outputs) -> None:
        s = self.session
        with s.internal():
            if all_finite(outputs):
                return
            if not all_finite(inputs):
                self.propagated += 1
                return
            origin = dict(record)
            origin["overflow"] = "origin"
            origin["inputs"] = [self.describer.describe(v, f"{record['name']}.input.{i}")
                                for i, v in enumerate(inputs if isinstance(inputs, (list, tuple)) else [inputs])]
            outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            origin["outputs"] = [self.describer.describe(v, f"{record['name']}.output.{i}")
                                 for i, v in enumerate(outs)]
            if record.get("op", "").endswith("_") or "__i" in record.get("op", ""):
                origin["note"] = "in-place op: inputs shown after the op overwrote them"
        s.emit(origin, force=True)
        s.flush()
        self.origins.append(origin)
        limit = s.config.overflow_nums
        log.warning("opdiff: %s", self.describe(origin))
        if limit != -1 and len(self.origins) >= limit:
            if s.writer is not None:
                s.writer.close()  # the dump must be complete before training stops
                s.writer = None
            raise OverflowDetected(self.describe(origin))

    def describe(self, origin: dict) -> str:
        s = self.session
        where = ""
        frames = s_frames(s, origin.get("stack"))
        if frames:
            f = frames[0]
            where = f" at {f['file']}:{f['line']} `{f['code']}`"
        module = f" in {origin['module']}" if origin.get("module") else ""
        return (f"inf/NaN first created by {origin['name']} ({origin['phase']}, step "
                f"{s.step_index}){module}{where}: its inputs are finite, its outputs are not")


def s_frames(session, stack_id):
    """Frames of a stack id from the open writer's table."""
    if stack_id is None or session.writer is None:
        return []
    for frames, sid in session.writer._stack_ids.items():
        if sid == stack_id:
            return [{"file": f, "line": ln, "function": fn, "code": code} for f, ln, fn, code in frames]
    return []
