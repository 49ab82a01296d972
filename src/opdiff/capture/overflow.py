"""task="overflow_check": catch the op where inf/NaN is born, online.

Every op's outputs (forward) or input-gradients (backward) are checked for non-finite values
with one reduction and one host transfer per op. Whether an op *created* the overflow is the
rule the offline analysis applies too (`opdiff.overflow.rules.judge`: its outputs are
non-finite while its inputs are all finite): an origin is written to the dump with full
tensors, its module and the user's source line. Ops that only pass inf/NaN along are counted. After
`overflow_nums` origins (-1: never), training stops with `OverflowDetected`.

A forward origin counts only once its inf/NaN reaches something that matters: a gradient (any
backward record, a parameter gradient), or a value that leaves the model (a forward record
outside every module: the root module's output, the loss). One that never does by the end of
the recorded region (T5's `torch.log(0)` in its position bucketing, turned into integers by
`.to(long)` or dropped by `torch.where`) is written as `"overflow": "discarded"` ("created and
discarded"), logged, and neither counted nor stops training. With level="L1" no op has a
module, so every non-finite forward output matters at once (the behaviour before).
"""
from __future__ import annotations

import logging
from typing import cast

import torch

from ..errors import OverflowDetected
from ..overflow import rules
from ..store.records import has_nonfinite_number
from ..store.schema import Kind, Phase, Record, Role, locations_from_frames
from .. import ops
from .describe import tensors_in
from .sink import PendingRecord

log = logging.getLogger("opdiff")


def all_finite(values) -> bool:
    """True when every floating tensor in values is free of inf/NaN (one transfer for all).

    A sum is one read pass with no temporary the size of the tensor, and inf/NaN always make it
    non-finite; only when a sum is not finite (a real inf/NaN, or finite values whose sum
    overflowed) are the tensors checked element by element.
    """
    tensors = [t for t in tensors_in(values)
               if (t.is_floating_point() or t.is_complex()) and t.numel() and not t.is_meta]
    if not tensors:
        return True
    sums = [(t.sum(dtype=torch.float32) if t.element_size() < 4 and t.is_floating_point()
             else t.sum()).abs().to(torch.float64) for t in tensors]
    if bool(torch.stack(sums).isfinite().all().item()):
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all().item())


class OverflowMonitor:
    """Per-session overflow state: origins found, ops that propagated inf/NaN.

    Forward origins stop training at once. Backward origins wait for GradScaler's verdict: when
    `scaler.step()` finds inf/NaN gradients (the step is skipped, expected with loss scaling)
    they are marked "skipped by loss scaler" and not counted; otherwise they count at `stop()`.
    """

    def __init__(self, session, describer):
        self.session = session
        self.describer = describer      # saves full tensors for the origin records
        self.origins: list[dict] = []   # the origin records (as written to the dump)
        self.propagated = 0
        self.skipped_by_scaler = 0
        self.pending: list[PendingRecord] = []   # backward origins waiting for the loss scaler
        self.unreached: list[PendingRecord] = []  # forward origins whose inf/NaN matters not yet
        self.discarded = 0              # forward origins whose inf/NaN never mattered
        self.tainted: set = set()       # forward ops that saw inf/NaN (their backward inherits it)
        self.enclosing: set = set()     # module calls that contain an origin
        self.stopped = False

    def check(self, record: dict, inputs, outputs, inputs_finite: bool | None = None) -> None:
        """One op's record and values: an origin is written and counted, a propagation counted.

        inputs_finite: for an in-place op, whether its inputs were finite before it ran (its
        `inputs` are then what it wrote over them)."""
        s = self.session
        if ops.traits(str(record.get("op"))).loss_scaler:
            self._scaler(record, inputs)
            return
        with s.own():
            if all_finite(outputs):
                return
            if record["phase"] == Phase.FORWARD:
                self.tainted.add(record["name"])
            inside = record.get("kind") == Kind.MODULE and record["name"] in self.enclosing
            in_place = inputs_finite is not None
            if not in_place and not inside:    # (around an origin, its inputs do not matter)
                inputs_finite = all_finite(inputs)
            # One check tells "finite or not": NONFINITE for a side that is not keeps the rules
            # that need to know which (inf turned into NaN) out, as the offline walk does when
            # it cannot tell either.
            reached = False
            # (capture builds its records as plain dicts of `Record`'s fields, unchecked)
            verdict = rules.judge(rules.FINITE if inside or inputs_finite else rules.NONFINITE,
                                  rules.NONFINITE, inside_origin=inside,
                                  given_nonfinite_number=has_nonfinite_number(cast(Record, record)),
                                  forward_nonfinite=record.get("forward") in self.tainted)
            if verdict.kind != rules.ORIGIN:
                if verdict.why == rules.CONTAINS_ORIGIN:
                    self.enclosing.add(record.get("module"))
                self.propagated += 1
                reached = bool(self.unreached) and _matters(record)
            else:
                name = record["name"]
                origin = dict(record)
                origin["overflow"] = "origin"
                origin["inputs"] = [self.describer.describe(v, name, Role.INPUT, i) for i, v in
                                    enumerate(inputs if isinstance(inputs, (list, tuple)) else [inputs])]
                outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
                origin["outputs"] = [self.describer.describe(v, name, Role.OUTPUT, i)
                                     for i, v in enumerate(outs)]
                if in_place:
                    origin["note"] = ("in-place op: its inputs were finite before it ran; they are "
                                      "shown after the op overwrote them")
        if verdict.kind != rules.ORIGIN:
            if reached:
                self._reached()
            return
        self.enclosing.add(record.get("module"))
        found = PendingRecord(origin)
        if record["phase"] == Phase.FORWARD and not _matters(record) \
                and rules.at_singularity(record.get("op") or "", origin["inputs"]):
            self.unreached.append(found)   # written once it is known whether it mattered
            return
        self._write(found)
        if record["phase"] == Phase.BACKWARD:
            self.pending.append(found)     # GradScaler may still skip this step
        else:
            self._count([found])

    def _write(self, found: PendingRecord) -> None:
        s = self.session
        s.emit(found.record, force=True)
        s.flush()
        found.message = self.describe(found.record)
        log.warning("opdiff: %s", found.message)

    def _reached(self) -> None:
        """The inf/NaN of this step's forward origins reached a gradient or the model's output."""
        reached, self.unreached = self.unreached, []
        for found in reached:
            self._write(found)
        self._count(reached)

    def _discard(self) -> None:
        """End of the region: forward origins whose inf/NaN never mattered."""
        s = self.session
        for found in self.unreached:
            found.record["overflow"] = "discarded"
            s.emit(found.record, force=True)
            self.discarded += 1
            log.info("opdiff: inf/NaN created and discarded by %s (step %d): it reaches no "
                     "gradient, parameter or output of the model", found.record["name"],
                     s.step_index)
        if self.unreached:
            s.flush()
        self.unreached = []

    def _count(self, origins: list) -> None:
        """Origins that are model problems: stop once there are `overflow_nums` of them."""
        s = self.session
        self.origins.extend(o.record for o in origins)
        limit = s.config.overflow_nums
        if origins and limit != -1 and len(self.origins) >= limit and not self.stopped:
            self.stopped = True
            s.close_writer()  # the dump must be complete before training stops
            raise OverflowDetected(origins[-1].message)

    def _scaler(self, record: dict, inputs) -> None:
        """GradScaler's unscale: inf/NaN gradients mean it skips this optimizer step."""
        s = self.session
        args = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if len(args) < 3 or not isinstance(args[1], torch.Tensor):
            return
        with s.own():
            found = bool(args[1].item()) if "unscale" in record["op"] else bool(args[2].item())
        if not found or not self.pending:
            return
        self.skipped_by_scaler += len(self.pending)
        mark = dict(record, overflow="skipped_by_loss_scaler",
                    origins=[o.record["name"] for o in self.pending])
        mark.pop("outputs", None)
        log.info("opdiff: the loss scaler skipped step %d (inf/NaN gradients, first from %s): "
                 "expected with loss scaling", s.step_index, self.pending[0].record["name"])
        self.pending.clear()
        s.emit(mark, force=True)

    def settle(self) -> None:
        """End of the recorded region: backward origins no loss scaler skipped now count."""
        self._discard()
        pending, self.pending = self.pending, []
        self._count(pending)

    def describe(self, origin: dict) -> str:
        """One sentence for the log and OverflowDetected: the op, its module, the user's line."""
        s = self.session
        where = ""
        locations = locations_from_frames(s.writer.stack_frames(origin.get("stack"))
                                          if s.writer is not None else ())
        if locations:
            loc = locations[0]
            where = f" at {loc.file}:{loc.line}" + (f" `{loc.code}`" if loc.code else "")
        module = f" in {origin['module']}" if origin.get("module") else ""
        return (f"inf/NaN first created by {origin['name']} ({origin['phase']}, step "
                f"{s.step_index}){module}{where}: its inputs are finite, its outputs are not")


def _matters(record: dict) -> bool:
    """Does inf/NaN in this record's outputs matter whatever comes later: a gradient, or a
    forward value outside every module (the root module's output, the loss)?"""
    return rules.matters(record.get("phase"), record.get("kind"), record.get("module"))
