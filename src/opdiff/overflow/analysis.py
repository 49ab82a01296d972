"""Find where inf/NaN was born in a dump: the origin op, the ops it spread through, and whether
the loss scaler skipped the step.

The origin is the first op, in execution order (forward and backward), whose inputs are finite
and whose outputs are not. Three kinds of op look like origins but are not:

- a module call that *contains* the origin op (in `mix` dumps the module is recorded too);
- a backward op whose forward op already saw inf/NaN: it reads the saved non-finite activations,
  so its gradients are non-finite even when the incoming gradient is finite;
- an op the user fed an inf/NaN literal (`masked_fill(mask, -inf)` for attention): intentional.

After an intentional -inf, an op that turns it into NaN (softmax of a fully masked row) is an
origin of NaN. Everything else that outputs inf/NaN after the origin is the chain. The rule for
one op is `opdiff.overflow.rules.judge`, shared with the online monitor; this module walks a
dump and keeps what the rule needs to know of the ops before.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..store.records import has_nonfinite_number, iter_tensors
from ..store.schema import Descriptor, Kind, Location, Phase, Record, RecordName, Role, locations_from_frames
from . import headroom as _headroom
from . import rules
from .classify import health, sides
from .result import (CLEAN, DISCARDED, INHERITED, OVERFLOW, SKIPPED, ChainLink, Origin, OverflowResult,
                     StepFinding)
from .scaler import ScaledLoss, is_scaler_op, scaler_found_inf

log = logging.getLogger("opdiff")

MAX_CHAIN = 500             # links kept per step (all are counted)


def analyze(path, headroom_factor: float = 2.0) -> OverflowResult:
    """Analyse every step/rank dump under `path` (opdiff, msprobe or ptdbg_ascend).

        result = opdiff.overflow.analyze("./dump/npu")
        if result.origin:
            print(result.origin.name, result.origin.phase, result.origin.location)

    `headroom_factor` (>= 1) flags fp32/bf16 outputs with max|x| * factor >= 65504 (and fp16
    outputs within that factor of fp16's maximum). Raises DumpError when nothing readable is there.
    """
    from ..errors import ConfigError
    from ..store.adapters import discover

    if not headroom_factor >= 1:
        raise ConfigError(f"headroom factor must be >= 1 (1 flags only real fp16 overflow); "
                          f"got {headroom_factor!r}")
    steps, warnings = [], []
    for dump in discover(path):
        finding, warns = analyze_dump(dump, headroom_factor)
        steps.append(finding)
        warnings.extend(warns)
    warnings.sort(key=lambda w: -w.max_abs / w.limit)
    return OverflowResult(dump=str(path), steps=steps, headroom=warnings,
                          headroom_factor=headroom_factor)


def analyze_dump(dump, headroom_factor: float = 2.0) -> tuple[StepFinding, list]:
    """Origins, chain and loss-scaler verdict of one step/rank dump, plus its headroom warnings."""
    walk = _Walk(dump, headroom_factor)
    for record in dump.records():
        walk.visit(record)
    return walk.finish()


class _Walk:
    """State of one pass over a dump's records, in execution order."""

    def __init__(self, dump, factor: float):
        self.dump = dump
        self.factor = factor
        self.origins: list[Origin] = []
        self.chain: list[ChainLink] = []
        self.intentional: list[str] = []
        self.tainted_forward: set[str] = set()    # forward ops that saw inf/NaN
        self.enclosing: set[tuple] = set()        # (module call, phase) containing an origin
        self.counts = dict(records=0, nonfinite=0, propagated=0, absorbed=0, chain=0)
        self.scaler: dict | None = None
        self.inherited: Origin | None = None
        self.headroom: list = []
        self.module_headroom: list = []
        self.scaled_loss = ScaledLoss()           # drops warnings about the scaler's own values
        self.warned: dict[int, Record] = {}         # id(HeadroomWarning) -> its record
        self.has_ops = False
        self.last_matters = -1                    # position of the last non-finite that matters
        self.positions: dict[str, int] = {}       # origin name -> its position
        self.discarded: set[str] = set()          # origins the online monitor found discarded
        self.singular: set[str] = set()           # origins at a pole or domain edge (log(0))
        self.fp16_run = False                     # an fp16 tensor was seen: the run is in fp16

    def visit(self, rec: Record) -> None:
        self.counts["records"] += 1
        kind, phase, name = rec["kind"], rec["phase"], rec["name"]
        if not self.fp16_run:
            self.fp16_run = _headroom.holds_fp16(rec)
        if kind == _LEAF:           # a parameter/input as it entered: the ops reading it judge it
            return
        if kind in (Kind.API, Kind.ATEN):
            self.has_ops = True
        if self.factor:
            self.scaled_loss.see(rec)
        if is_scaler_op(rec):       # before measuring anything: the scaler rules read it
            self._scaler(rec)
            return
        ins, outs = sides(rec)
        hin, hout = health(ins, self.dump), health(outs, self.dump)
        if hout.finite:             # what the rule needs of the ops before matters only now
            verdict = rules.judge(hin, hout)
        else:
            verdict = rules.judge(
                hin, hout, given_nonfinite_number=has_nonfinite_number(rec),
                inside_origin=kind == Kind.MODULE and (_forward_form(name), phase) in self.enclosing,
                forward_nonfinite=phase == Phase.BACKWARD and _forward_of(rec) in self.tainted_forward,
                # parameter gradients are accumulated from the backward ops already seen
                accumulated_after_nonfinite=kind == Kind.PARAM_GRAD and (
                    bool(self.origins) or self.inherited is not None),
                origin_seen=bool(self.origins))
        if verdict.kind == rules.CLEAN:
            if self.factor:
                warns = _headroom.warnings_for(rec, self.factor, self._location(rec),
                                               self.dump.step, self.dump.rank,
                                               fp16_run=self.fp16_run)
                (self.module_headroom if kind == Kind.MODULE else self.headroom).extend(warns)
                self.warned.update((id(w), rec) for w in warns)
            return
        if phase == Phase.FORWARD:
            self.tainted_forward.add(name)
        if verdict.kind == rules.ABSORBED:
            self.counts["absorbed"] += 1
            return
        self.counts["nonfinite"] += 1
        position = self.counts["records"]
        if rec.get("overflow") == "discarded":
            self.discarded.add(name)
        elif rec.get("overflow") == "origin" or rules.matters(phase, kind, rec["module"]):
            self.last_matters = position      # (the online monitor writes only origins that matter)
        if verdict.kind == rules.ORIGIN:
            self.positions[name] = position
            self._origin(rec, hin, hout, verdict.why)
        elif verdict.kind == rules.INTENTIONAL:
            self.intentional.append(name)
        elif verdict.why == rules.CONTAINS_ORIGIN:
            self._link(rec, verdict.why)
            self.enclosing.add((rec["module"], phase))
        else:
            self._link(rec, verdict.why)
            if verdict.why == rules.PROPAGATES and not self.origins and not self.intentional \
                    and self.inherited is None:
                self.inherited = self._make_origin(
                    rec, hin, hout, "its inputs already hold inf/NaN that no recorded op produced "
                    "(input data, parameters, or ops outside the dump)")

    def _origin(self, rec, hin, hout, why: str) -> None:
        origin = self._make_origin(rec, hin, hout, why)
        if rules.at_singularity(rec["op"] or rec["name"], list(rec["inputs"])):
            self.singular.add(rec["name"])      # (only these may be created and discarded)
        if self.origins:
            self._link(rec, "new origin")
        self.origins.append(origin)
        self.enclosing.add((rec["module"], rec["phase"]))

    def _make_origin(self, rec, hin, hout, why: str) -> Origin:
        created = "inf and NaN" if (hout.nan and hout.inf) else ("NaN" if hout.nan else "inf")
        ins: list[dict] = []
        outs: list[dict] = []
        for tname, role, desc in iter_tensors(rec):
            side = outs if (role == Role.OUTPUT or rec["kind"] == Kind.PARAM_GRAD) else ins
            side.append(_tensor_summary(tname, desc))
        return Origin(name=rec["name"], op=rec["op"] or rec["name"],
                      phase=rec["phase"], kind=rec["kind"],
                      reason=why, location=self._location(rec), module=rec["module"],
                      nonfinite=created, outputs=tuple(outs), inputs=tuple(ins),
                      step=self.dump.step, rank=self.dump.rank)

    def _link(self, rec: Record, relation: str) -> None:
        if relation == rules.PROPAGATES:
            self.counts["propagated"] += 1
        if self.origins or self.inherited is not None:
            self.counts["chain"] += 1
            if len(self.chain) < MAX_CHAIN:
                self.chain.append(ChainLink(rec["name"], rec["phase"], relation))

    def _scaler(self, rec: Record) -> None:
        found = scaler_found_inf(rec, self.dump)
        if self.scaler is None:
            self.scaler = {"op": rec["name"], "found_inf": found, "skipped": bool(found)}
        elif found:
            self.scaler.update(op=rec["name"], found_inf=True, skipped=True)

    def _location(self, rec: Record) -> Location | None:
        try:
            frames = self.dump.stack(rec["stack"])
        except Exception as exc:   # a foreign stack we cannot read should not hide the finding
            log.info("opdiff: no call stack for %s (%s)", rec["name"], exc)
            return None
        locations = locations_from_frames(frames)
        return locations[0] if locations else None

    def finish(self) -> tuple[StepFinding, list]:
        skipped = bool(self.scaler and self.scaler["skipped"])
        origins = [dataclasses.replace(o, skipped_by_loss_scaler=True)
                   if skipped and o.phase == Phase.BACKWARD else o for o in self.origins]
        origins = [dataclasses.replace(o, discarded=True) if self._discarded(o) else o
                   for o in origins]
        model_origins = [o for o in origins if not (o.skipped_by_loss_scaler or o.discarded)]
        if model_origins:
            status = OVERFLOW
        elif any(o.skipped_by_loss_scaler for o in origins):
            status = SKIPPED
        elif origins:
            status = DISCARDED
        elif self.inherited is not None:
            status, origins = INHERITED, [self.inherited]
        else:
            status = CLEAN
        # Show the origin that needs fixing first; scaler-skipped and discarded ones follow.
        origins.sort(key=lambda o: (o.skipped_by_loss_scaler, o.discarded))
        finding = StepFinding(path=str(self.dump.path), format=self.dump.format,
                              step=self.dump.step, rank=self.dump.rank, status=status,
                              origins=origins, chain=self.chain, counts=self.counts,
                              loss_scaler=self.scaler, intentional=self.intentional[:50])
        finding.message = _message(finding)
        warnings = self.headroom + ([] if self.has_ops else self.module_headroom)
        warnings = [self.scaled_loss.note(w) for w in warnings
                    if self.scaled_loss.keep(self.warned[id(w)], w.tensor)]
        return finding, warnings


    def _discarded(self, o: Origin) -> bool:
        """A forward origin whose inf/NaN reached no gradient, parameter or model output, made
        at a singularity (`rules.at_singularity`): an overflow's inf matters wherever it goes."""
        if o.name not in self.singular:
            return False
        if o.name in self.discarded:
            return True
        return o.phase == Phase.FORWARD and self.positions.get(o.name, -1) > self.last_matters


_LEAF = getattr(Kind, "LEAF", "leaf")     # leaf records (parameters, inputs) are not ops


def _forward_form(name: str) -> str:
    """A module call's backward name as its forward call's (other names unchanged)."""
    parsed = RecordName.parse(name)
    if parsed is not None and parsed.kind == Kind.MODULE and parsed.phase == Phase.BACKWARD:
        return parsed.with_phase(Phase.FORWARD).text
    return name


def _forward_of(rec: Record) -> str | None:
    """Name of the forward record a backward record belongs to."""
    if rec.get("forward"):
        return rec["forward"]
    if rec["kind"] == Kind.ATEN:
        return None     # aten backward counters are their own; only the record's link is reliable
    parsed = RecordName.parse(rec["name"])
    if parsed is None or parsed.phase != Phase.BACKWARD or parsed.kind == Kind.PARAM_GRAD \
            or parsed.text != rec["name"]:      # legacy-form names: adapters rename them
        return None
    return parsed.with_phase(Phase.FORWARD).text


def _tensor_summary(name: str, desc: Descriptor) -> dict[str, Any]:
    stats = desc.get("stats") or {}
    out: dict[str, Any] = {"name": name, "dtype": desc.get("dtype"), "shape": desc.get("shape")}
    out.update({k: stats.get(k) for k in ("max", "min", "nan", "inf")})
    if desc.get("key"):
        out["key"] = desc["key"]
    return out


def _message(f: StepFinding) -> str:
    where = f"step {f.step}, rank {f.rank}" if f.step is not None else f.path
    if f.status == CLEAN:
        extra = f" ({len(f.intentional)} op(s) fed inf on purpose)" if f.intentional else ""
        return f"{where}: no op created inf/NaN{extra}"
    o = f.origins[0]
    loc = f" at {o.location.file}:{o.location.line} `{o.location.code}`" if o.location else ""
    if f.status == SKIPPED:
        return (f"{where}: inf/NaN appeared only in gradients (first {o.name}) and the loss scaler "
                f"skipped the step: expected with loss scaling, not a model bug")
    if f.status == DISCARDED:
        return (f"{where}: inf/NaN created and discarded by {o.name}{loc}: it reaches no "
                f"gradient, parameter or output of the model (not an overflow)")
    if f.status == INHERITED:
        return f"{where}: {o.name}{loc} received inf/NaN that no recorded op produced"
    spread = f"; {f.counts['chain']} op(s) passed it on" if f.counts.get("chain") else ""
    return f"{where}: {o.nonfinite} first created by {o.name} ({o.phase}){loc}{spread}"
