"""`opdiff check`: one dump, no golden run; every op judged against a float64 replay on the CPU.

    from opdiff.check import check_dump
    result = check_dump("./dump/npu/step0/rank0")          # a task="tensor" dump
    result.first_failure, result.checked, result.failed
    check_dump("./dump/npu", device="npu")                  # a statistics dump: re-run on the device

Per op and output: golden = the op re-run in float64 on the CPU on the recorded inputs;
reference = the op re-run on the CPU in the recorded dtypes; target = the recorded output
(tensor dumps) or the op re-run on `device` on made-up inputs within the dumped ranges
(statistics dumps, `opdiff.check.inputs`). The standards are in `opdiff.check.standards`.
Backward records are replayed through autograd on the forward call with the recorded output
gradient. A kernel Inductor generated (kind `kernel`) is replayed as the program of aten ops
stored with it (`opdiff.comparison.replay.kernels`; tensor dumps). Ops that cannot be replayed
(random ops, collectives, inputs not saved, custom ops without a registered CPU reference:
`opdiff.ops.register(name, cpu_reference=...)`) are listed with the reason and never counted
as checked.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Optional

from ..comparison import compiled
from ..comparison.replay.calls import NotReplayable
from ..comparison.replay.kernels import kernel_tensors
from ..comparison.replay.local import one_thread
from ..comparison.replay.tensors import replay_tensors
from ..comparison.verdicts import Policy
from ..store.schema import Kind, Location, Record, locations_from_frames
from .standards import FAIL, PASS, OutputCheck, judge_output

log = logging.getLogger("opdiff")

NOT_CHECKED = "not_checked"


@dataclass(frozen=True)
class OpCheck:
    """The verdict on one record: PASS, FAIL or NOT_CHECKED (with the reason)."""
    name: str                       # record name, e.g. "Functional.conv2d.0.forward"
    op: str
    phase: str
    index: int                      # position in execution order
    status: str
    reason: str = ""                # why it failed / why it was not checked
    reference: str = ""             # the reference kernel, e.g. "bfloat16 CPU kernel (autocast)"
    outputs: tuple[OutputCheck, ...] = ()
    location: Optional[Location] = None
    module: Optional[str] = None
    seconds: float = 0.0

    @property
    def worst(self) -> Optional[OutputCheck]:
        """The first failing output, else None."""
        return next((o for o in self.outputs if o.status == FAIL), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (check_progress.jsonl, summary.json)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpCheck":
        """The inverse of to_dict."""
        loc = d.get("location")
        return cls(**{**d, "outputs": tuple(OutputCheck(**o) for o in d.get("outputs", ())),
                      "location": Location(**loc) if loc else None})


@dataclass
class CheckResult:
    """Every op's verdict for one dump, in execution order."""
    dump: str
    ops: list[OpCheck]
    mode: str = "tensor"            # "tensor" | "statistics"
    device: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def checked(self) -> list[OpCheck]:
        return [o for o in self.ops if o.status != NOT_CHECKED]

    @property
    def failures(self) -> list[OpCheck]:
        return [o for o in self.ops if o.status == FAIL]

    @property
    def not_checked(self) -> list[OpCheck]:
        return [o for o in self.ops if o.status == NOT_CHECKED]

    @property
    def first_failure(self) -> Optional[OpCheck]:
        """The first failing op in execution order (None when nothing failed)."""
        return next(iter(self.failures), None)

    def summary(self) -> dict[str, Any]:
        """What summary.json holds."""
        def failure(o: OpCheck) -> dict[str, Any]:
            w = o.worst
            return {"name": o.name, "op": o.op, "phase": o.phase,
                    "location": asdict(o.location) if o.location else None,
                    "reason": o.reason, "tensor": w.name if w else None,
                    "metrics": dict(w.metrics, error=w.error,
                                    reference_error=w.reference_error) if w else {}}
        first = self.first_failure
        return {"dump": self.dump, "mode": self.mode, "device": self.device,
                "checked": len(self.checked), "failed": len(self.failures),
                "first_failure": failure(first) if first else None,
                "failures": [failure(o) for o in self.failures],
                "not_checked": [{"name": o.name, "op": o.op, "phase": o.phase,
                                 "reason": o.reason} for o in self.not_checked],
                "notes": list(self.notes), "seconds": round(self.seconds, 3)}


def location_of(dump: Any, record: Record,
                records: dict[str, Record]) -> Optional[Location]:
    """The user's source line of a record (a backward record: its forward call's; an op of a
    torch.compile'd graph: the line its graph node names, without its text, which the dump
    does not hold)."""
    line = compiled.source(record)
    if line is not None:
        return line
    rec = record
    forward = rec.get("forward")
    if rec["stack"] is None and forward in records:
        rec = records[str(forward)]
    if rec["stack"] is None:
        return None
    frames = locations_from_frames(dump.stack(rec["stack"]))
    return frames[0] if frames else None


def check_record(record: Record, records: dict[str, Record],
                 load: Callable[[str], Any], index: int, policy: Optional[Policy] = None,
                 device: Optional[str] = None, location: Optional[Location] = None,
                 known: Optional[dict[str, Any]] = None) -> OpCheck:
    """Check one record; never raises for a record that cannot be replayed. `known`: a dict
    kept across the records of one dump (see `opdiff.comparison.replay.tensors.replay_tensors`)."""
    policy = policy or Policy()
    start = time.perf_counter()
    base: dict[str, Any] = dict(name=record["name"], op=record["op"], phase=record["phase"],
                index=index, location=location,
                module=record["module"] or (record.get("compiled") or {}).get("module"))
    if record["kind"] == Kind.KERNEL:
        return check_kernel(record, load, base, policy, device, start)
    if record["kind"] not in Kind.REPLAYABLE:
        return OpCheck(**base, status=NOT_CHECKED, reason=f"a {record['kind']} record is "
                       "made of other ops (its ops are checked one by one)")
    forward = record.get("forward")
    fwd = records.get(forward) if forward else None
    try:
        with one_thread():      # the same numbers in every process (see replay.local)
            rep = replay_tensors(record, load, forward_record=fwd, device=device, known=known)
            outs = tuple(judge_output(base["op"], base["phase"], name, t, e, r, policy,
                                      rep.reference) for name, t, e, r in rep.outputs)
    except NotReplayable as exc:
        return OpCheck(**base, status=NOT_CHECKED, reason=str(exc),
                       seconds=time.perf_counter() - start)
    except Exception as exc:  # a call torch refuses: say so, never guess
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:100]
        return OpCheck(**base, status=NOT_CHECKED, reason=f"replay failed ({text})",
                       seconds=time.perf_counter() - start)
    bad = next((o for o in outs if o.status == FAIL), None)
    return OpCheck(**base, status=FAIL if bad else PASS, reason=bad.reason if bad else "",
                   reference=rep.reference, outputs=outs, seconds=time.perf_counter() - start)


def check_kernel(record: Record, load: Callable[[str], Any], base: dict[str, Any],
                 policy: Policy, device: Optional[str], start: float) -> OpCheck:
    """A compiled kernel judged as an op is: its outputs against its fused aten ops replayed in
    float64 from its saved inputs, with the same ops in their own dtypes on the CPU as the
    reference (`opdiff.comparison.replay.kernels`)."""
    def not_checked(why: str) -> OpCheck:
        return OpCheck(**base, status=NOT_CHECKED, reason=f"a kernel Inductor generated: {why}",
                       seconds=time.perf_counter() - start)
    if device is not None:
        return not_checked("a statistics dump holds none of its tensors (dump with "
                           "task='tensor' to judge it)")
    try:
        with one_thread():
            rep = kernel_tensors(record, load)
            outs = tuple(judge_output(base["op"], base["phase"], name, t, e, r, policy,
                                      rep.reference) for name, t, e, r in rep.outputs)
    except NotReplayable as exc:
        return not_checked(str(exc))
    except Exception as exc:  # a call torch refuses: say so, never guess
        return not_checked(f"replay failed ({f'{type(exc).__name__}: {exc}'.splitlines()[0][:100]})")
    bad = next((o for o in outs if o.status == FAIL), None)
    return OpCheck(**base, status=FAIL if bad else PASS, reason=bad.reason if bad else "",
                   reference=rep.reference, outputs=outs, seconds=time.perf_counter() - start)


def select(records: Iterable[Record], names: Iterable[str] = (),
           scope: Iterable[str] = ()) -> list[Record]:
    """The records `--list` and `--scope` keep, as capture's `list`/`scope` select them: a
    pattern matches a record name exactly, without its counter, or as a substring; a scope of
    two names keeps the records from the first match of the first through the first match of
    the second (one name: that op and what follows)."""
    from ..store.schema import RecordName, legacy_to_dotted

    def matches(pattern: str, name: str) -> bool:
        pattern = legacy_to_dotted(pattern)
        parsed = RecordName.parse(name)
        return pattern in name or (parsed is not None and parsed.without_index == pattern)

    names, scope = list(names), list(scope)
    out, inside, closed = [], not scope, False
    for rec in records:
        name = rec["name"]
        if scope and not inside and not closed and matches(scope[0], name):
            inside = True
        keep = inside and (not names or any(matches(p, name) for p in names))
        if keep:
            out.append(rec)
        if inside and scope and len(scope) > 1 and matches(scope[-1], name):
            inside, closed = False, True
    return out
