"""The evidence chain of one CompareResult: its verdict, the facts it rests on, a confidence.

Read from what a finished compare holds (the first divergence, the rows in execution order, the
notes with their kinds), in one pass over the rows (a many-rank result streams them from disk),
keeping a bounded number of them. Each fact is a dict with a `type` (one of `FACT_TYPES`), a
sentence `says` for people, and the numbers an agent reads by name; see the schema's
`$defs/evidence` for every field.

A tensor's `floor` is the relative error beyond which a tensor of its dtype pair does not agree
under the default thresholds (`Policy.tolerance_for`: float32 1e-5, bfloat16 1.6e-2, ...), and
its `ratio` is its error over that floor: below 1 it agrees, above 1 it does not.
"""
from __future__ import annotations

import math
from collections import Counter, deque
from typing import Any, Iterable, Optional

from ..comparison.result import (ERROR, MIN_COVERAGE, PASS, REPLAY, UNMATCHED, WARNING, Note, Origin,
                                 note_kind)
from ..comparison.verdicts import Policy
from .next_step import next_step

VERDICTS = ("culprit", "origin", "inconclusive", "no_divergence")
CONFIDENCES = ("confirmed", "probable", "none")
FACT_TYPES = ("origin_rule", "inputs_agree", "inputs_differ", "output_differs", "replay",
              "upstream_cleared", "statistics_only", "unjudged", "incomplete", "pairing",
              "other_pairs", "pairs", "coverage", "first_error_unblamed", "downstream", "explained")
# Why an upstream op with a difference was not named (`upstream_cleared`'s `why`).
CLEARED = ("within_floor", "inherited", "not_blamed")

UPSTREAM_KEPT = 8          # the upstream ops a chain lists (the nearest to the culprit)
TENSORS_KEPT = 16          # the culprit's tensors a fact lists
REASON_CHARS = 400         # a quoted reason is cut there

# Notes a fact of its own says, by kind (never by their words).
_NOTE_FACTS = {Note.INCONCLUSIVE: "unjudged", Note.DUMPS: "incomplete", Note.PAIRING: "pairing",
               Note.SHARDING: "pairing", Note.RANKS: "other_pairs"}


def _number(v: Any) -> Optional[float]:
    """A finite float, or None (NaN, infinities and missing values are not numbers to compare)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _quote(text: Any) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def _sig(x: Optional[float]) -> str:
    return "unknown" if x is None else f"{x:.3g}"


class _Tensor:
    """One row seen through its floor."""

    def __init__(self, row: Any, policy: Policy) -> None:
        self.row = row
        self.error = _number(row.error)
        self.floor = policy.tolerance_for(row.target_dtype, row.golden_dtype)
        self.ratio: Optional[float] = None
        if self.error is not None and self.floor > 0:
            self.ratio = self.error / self.floor
        elif self.error is not None:            # integers: equal or not
            self.ratio = 0.0 if self.error == 0 else math.inf

    def agrees(self) -> bool:
        return self.ratio is not None and self.ratio <= 1.0

    def as_dict(self) -> dict[str, Any]:
        r = self.row
        return {"name": r.target_name or r.golden_name, "role": r.role, "error": self.error,
                "floor": self.floor, "ratio": _number(self.ratio),
                "scale_error": _number(r.scale_error), "dtype": r.target_dtype or r.golden_dtype,
                "mode": r.mode, "result": r.result}


class _Upstream:
    """The ops before the culprit whose tensors differ, and why each was not named."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.ops: dict[str, dict[str, Any]] = {}
        self.order: deque[str] = deque()
        self.count = 0
        # the op whose rows are being read (an op's rows are contiguous) and its worst errors so
        # far: most rows pass, and only ops with an output beyond "pass" are kept
        self._op: Optional[str] = None
        self._inputs: Optional[float] = None
        self._outputs: Optional[float] = None

    def add(self, row: Any) -> None:
        if row.result == UNMATCHED:
            return
        name = row.op_name
        if name != self._op:
            self._op, self._inputs, self._outputs = name, None, None
        error = _number(row.error)
        op = self.ops.get(name)
        if row.role != "output":
            if error is not None and (self._inputs is None or error > self._inputs):
                self._inputs = error
                if op is not None:
                    op["input_error"] = error
            return
        if op is None:
            if row.result == PASS:
                if error is not None and (self._outputs is None or error > self._outputs):
                    self._outputs = error
                return
            op = {"name": name, "output_error": self._outputs, "input_error": self._inputs,
                  "floor": self.policy.tolerance_for(row.target_dtype, row.golden_dtype),
                  "result": row.result, "reason": _quote(row.reason), "step": row.step,
                  "rank": row.rank}
            self.ops[name] = op
            self.order.append(name)
            self.count += 1
            if len(self.order) > UPSTREAM_KEPT:       # bounded: only the nearest are told
                self.ops.pop(self.order.popleft(), None)
        if error is not None and (op["output_error"] is None or error > op["output_error"]):
            op["output_error"] = error
            op["floor"] = self.policy.tolerance_for(row.target_dtype, row.golden_dtype)
        if row.result != PASS and op["result"] != ERROR:
            op["result"] = row.result

    def fact(self) -> Optional[dict[str, Any]]:
        shown = list(self.ops.values())
        if not shown:
            return None
        amplification = self.policy.amplification
        for op in shown:
            out, inp, floor = op["output_error"], op["input_error"], op["floor"]
            if out is not None and floor is not None and out <= floor:
                op["why"] = "within_floor"
            elif out is not None and inp is not None and out <= amplification * inp:
                op["why"] = "inherited"
            else:
                op["why"] = "not_blamed"
        return {"type": "upstream_cleared", "count": self.count, "ops": shown,
                "says": f"{self.count} earlier op(s) show a difference and were cleared: "
                        + "; ".join(f"{op['name']} ({_cleared_words(op)})" for op in shown[-3:])}


def _cleared_words(op: dict[str, Any]) -> str:
    if op["why"] == "within_floor":
        return f"rel err {_sig(op['output_error'])} within its floor {_sig(op['floor'])}"
    if op["why"] == "inherited":
        return (f"inherited: output rel err {_sig(op['output_error'])}, inputs already "
                f"{_sig(op['input_error'])}")
    return "not blamed by the rules: see its reason"


def evidence_of(result: Any, policy: Optional[Policy] = None,
                output: Optional[str] = None) -> dict[str, Any]:
    """The evidence chain of `result` (a CompareResult): {"verdict", "culprit", "confidence",
    "confidence_why", "facts", "next"}. `policy`: the thresholds the floors come from (default:
    opdiff's defaults; summary.json does not keep a compare's own); `output`: the compare's
    output directory, named in the next step's commands."""
    policy = policy or Policy()
    fd = result.first_divergence
    notes = list(result.notes or [])
    scan = _Scan(result.rows, fd, policy)
    facts: list[dict[str, Any]] = []
    if fd is not None:
        facts.append({"type": "origin_rule", "origin": fd.origin, "kind": fd.kind,
                      "says": _quote(fd.reason)})
        facts += scan.culprit_facts()
        replays = [i for i, n in enumerate(notes) if note_kind(n) == Note.REPLAY]
        if fd.kind == REPLAY or replays:
            facts.append({"type": "replay", "decisive": fd.kind == REPLAY,
                          "says": "re-run in float64 on its own saved inputs, the op's own error "
                                  "is beyond what its kernel makes" if fd.kind == REPLAY else
                                  "ops were re-run in float64 on their own saved inputs (what "
                                  "replay found is in the origin rule's words, how much it ran "
                                  "in the notes of kind replay)"})
        upstream = scan.upstream.fact() if fd.origin not in Origin.LEAVES else None
        if upstream:
            facts.append(upstream)
    elif scan.first_error is not None:
        facts.append(scan.first_error)
    elif scan.warnings:
        facts.append({"type": "explained", "warnings": scan.warnings, "of": scan.total,
                      "says": f"{scan.warnings} of {scan.total} tensor(s) differ, each within its "
                              "floor or by what its inputs carry in"})
    if scan.statistics:
        facts.append({"type": "statistics_only", "rows": scan.statistics, "of": scan.total,
                      "says": "errors measured from statistics (max, min, mean, norm) are lower "
                              "bounds and nothing can be replayed without tensors",
                      "notes": [i for i, n in enumerate(notes) if note_kind(n) == Note.THRESHOLDS]})
    for n in notes:
        kind = _NOTE_FACTS.get(note_kind(n))
        if kind:
            facts.append({"type": kind, "says": _quote(n)})
    pairs = _pairs_fact(result.pairs, fd)
    if pairs:
        facts.append(pairs)
    coverage = (scan.total - scan.unmatched) / scan.total if scan.total else None
    if coverage is not None and coverage < 0.95:
        facts.append({"type": "coverage", "coverage": coverage, "minimum": MIN_COVERAGE,
                      "unmatched": scan.unmatched,
                      "says": f"{coverage:.0%} of tensors have a partner on the other side"})
    if fd is not None and scan.downstream:
        facts.append({"type": "downstream", "errors": scan.downstream,
                      "says": f"{scan.downstream} error row(s) after the culprit; judge them "
                              "again once it is fixed"})
    verdict, confidence, why = _verdict(fd, notes, scan, coverage, result)
    chain: dict[str, Any] = {"verdict": verdict, "culprit": _culprit(fd, scan.culprit_kind),
                             "confidence": confidence,
                             "confidence_why": why, "facts": facts}
    chain["next"] = next_step(chain, result, scan.level(), scan.first_pair(), output)
    return chain


# Why a culprit named from tensors is confirmed, by origin.
_ORIGIN_WHY = {
    Origin.OP: "named from tensors: its inputs agree and its output does not",
    Origin.REGION: "named from tensors: the region's inputs agree and its outputs do not",
    Origin.PARAMETER: "named from tensors: the parameter differs before any op reads it",
    Origin.BUFFER: "named from tensors: the buffer differs before any op reads it",
    Origin.INPUT: "named from tensors: the model input differs before any op reads it",
    Origin.OUTSIDE: "named from tensors: a tensor changed between two recorded ops",
    Origin.RANDOM: "named from the generators' fingerprints: the op drew from generators in "
                   "different states",
    Origin.NUMBER: "named from the op's arguments: a Python number differs",
    Origin.COLLECTIVE: "named across ranks: the difference arrives through a collective",
    Origin.OPTIMIZER: "named across steps: the step before agreed, the parameters no longer do",
}


def _culprit(fd: Any, record_kind: Optional[str]) -> Optional[dict[str, Any]]:
    if fd is None:
        return None
    loc = fd.location
    return {"name": fd.name, "op": fd.op, "phase": fd.phase, "origin": fd.origin, "kind": fd.kind,
            "record_kind": record_kind,
            "tensor": fd.tensor, "module": fd.module, "step": fd.step, "rank": fd.rank,
            "location": None if loc is None else {"file": loc.file, "line": loc.line,
                                                  "code": loc.code, "function": loc.function}}


def _pairs_fact(pairs: Any, fd: Any) -> Optional[dict[str, Any]]:
    """Every step/rank pair that names its own first divergence or has error rows: a culprit on
    one rank says nothing of the others."""
    shown = []
    for p in pairs or []:
        if not isinstance(p, dict):
            continue
        first = p.get("first_divergence")
        name = first.get("name") if isinstance(first, dict) else getattr(first, "name", None)
        errors = (p.get("counts") or {}).get(ERROR, 0)
        if name or errors:
            shown.append({"step": p.get("step"), "rank": p.get("rank"), "first_divergence": name,
                          "errors": errors})
    if len(pairs or []) < 2 or not shown:
        return None
    said = "; ".join(f"step {p['step']} rank {p['rank']}: {p['first_divergence'] or 'no op named'}"
                     for p in shown[:4])
    return {"type": "pairs", "pairs": shown[:64], "count": len(shown),
            "says": f"{len(shown)} of {len(pairs)} step/rank pair(s) differ ({said}"
                    f"{'; ...' if len(shown) > 4 else ''})"}


def _verdict(fd: Any, notes: list, scan: "_Scan", coverage: Optional[float],
             result: Any) -> tuple[str, str, str]:
    unjudged = any(note_kind(n) == Note.INCONCLUSIVE for n in notes)
    incomplete = any(isinstance(p, dict) and (p.get("incomplete") or p.get("cut"))
                     for p in result.pairs or [])
    if fd is not None:
        verdict = "culprit" if fd.origin in (Origin.OP, Origin.REGION) else "origin"
        if scan.culprit_statistics:
            return verdict, "probable", ("named from statistics only: a tensor dump of that step "
                                         "and module confirms or clears it")
        if unjudged:
            return verdict, "probable", "named, but part of the run could not be judged"
        return verdict, "confirmed", _ORIGIN_WHY.get(fd.origin, _ORIGIN_WHY[Origin.OP])
    if unjudged or incomplete or scan.errors or (coverage is not None and coverage < MIN_COVERAGE):
        why = ("part of the run could not be judged" if unjudged else
               "a step, rank or side is missing or cut short" if incomplete else
               "tensors differ beyond their floor and no op is named" if scan.errors else
               f"only {coverage:.0%} of tensors have a partner")
        return "inconclusive", "none", why
    if scan.statistics:
        return "no_divergence", "probable", ("no op beyond its floor, from statistics only: a "
                                             "fault that keeps max, min, mean and norm stays unseen")
    return "no_divergence", "confirmed", "every difference is within its floor or explained by its inputs"


class _Scan:
    """One pass over the rows: the culprit's tensors, the ops before it, counts."""

    def __init__(self, rows: Iterable[Any], fd: Any, policy: Policy) -> None:
        self.policy = policy
        self.upstream = _Upstream(policy)
        self.culprit: list[_Tensor] = []
        self.total = self.statistics = self.unmatched = self.errors = self.downstream = 0
        self.warnings = 0
        self.culprit_statistics = False
        self.culprit_kind: Optional[str] = None     # the culprit record's kind (api, module, ...)
        self.first_error: Optional[dict[str, Any]] = None
        self._first_pair: Optional[tuple[Any, Any]] = None
        tally: Counter[tuple[str, str, str]] = Counter()
        seen_culprit = False
        upstream = self.upstream.add
        step, rank = (fd.step, fd.rank) if fd is not None else (None, None)
        for row in rows:                    # millions of rows: the common path stays short
            result = row.result
            tally[(result, row.mode, row.kind)] += 1
            if result == ERROR and self._first_pair is None:
                self._first_pair = (row.step, row.rank)
                if fd is None:
                    self.first_error = self._unblamed(row)
            if fd is None:
                continue
            if seen_culprit and row.op_name != fd.name:
                self.downstream += result == ERROR
            elif (step is None or row.step is None or row.step == step) and \
                    (rank is None or row.rank is None or row.rank == rank):
                if row.op_name == fd.name:
                    seen_culprit = True
                    self.culprit.append(_Tensor(row, policy))
                    self.culprit_kind = row.kind
                    self.culprit_statistics |= row.mode == "statistics"
                else:
                    upstream(row)
        for (result, mode, _kind), n in tally.items():
            self.total += n
            self.statistics += n if mode == "statistics" else 0
            self.unmatched += n if result == UNMATCHED else 0
            self.warnings += n if result == WARNING else 0
            self.errors += n if result == ERROR else 0
        self.kinds = {kind for _, _, kind in tally}
        if fd is not None:
            self._first_pair = (fd.step, fd.rank)

    def _unblamed(self, row: Any) -> dict[str, Any]:
        t = _Tensor(row, self.policy)
        return {"type": "first_error_unblamed", "name": row.target_name or row.golden_name,
                "op": row.op_name, "step": row.step, "rank": row.rank, "error": t.error,
                "floor": t.floor, "ratio": _number(t.ratio), "mode": row.mode,
                "says": f"first tensor beyond its floor, no op named: {row.op_name} "
                        f"({_quote(row.reason)})"}

    def culprit_facts(self) -> list[dict[str, Any]]:
        inputs = [t for t in self.culprit if t.row.role != "output" and t.ratio is not None]
        outputs = [t for t in self.culprit if t.row.role == "output" and t.ratio is not None]
        facts: list[dict[str, Any]] = []
        if inputs:
            worst = max(inputs, key=lambda t: t.ratio or 0.0)
            agree = all(t.agrees() for t in inputs)
            facts.append({"type": "inputs_agree" if agree else "inputs_differ",
                          "worst_ratio": _number(worst.ratio),
                          "tensors": [t.as_dict() for t in inputs[:TENSORS_KEPT]],
                          "says": f"{len(inputs)} input(s) {'agree' if agree else 'differ'}: worst "
                                  f"{worst.as_dict()['name']} rel err {_sig(worst.error)}, "
                                  f"{_sig(worst.ratio)} of its {worst.as_dict()['dtype']} floor "
                                  f"{_sig(worst.floor)}"})
        differ = [t for t in outputs if not t.agrees()] or outputs
        if differ:
            worst = max(differ, key=lambda t: t.ratio or 0.0)
            said = (f"output {worst.as_dict()['name']} rel err {_sig(worst.error)}, "
                    f"{_sig(worst.ratio)}x its {worst.as_dict()['dtype']} floor {_sig(worst.floor)}")
            scale = _number(worst.row.scale_error)
            if worst.agrees() and scale is not None:
                said += f", but scaled against golden by {scale:+.3g}: a systematic error"
            facts.append({"type": "output_differs", "worst_ratio": _number(worst.ratio),
                          "tensors": [t.as_dict() for t in differ[:TENSORS_KEPT]], "says": said})
        return facts

    def level(self) -> Optional[str]:
        """The capture level the rows show (None: not a capture of opdiff's levels, e.g. ONNX)."""
        if "aten" in self.kinds:
            return "L2"
        ops = bool(self.kinds & {"api", "kernel"})
        if ops and "module" in self.kinds:
            return "mix"
        if ops:
            return "L1"
        if "module" in self.kinds:
            return "L0"
        return None

    def first_pair(self) -> Optional[tuple[Any, Any]]:
        return self._first_pair


__all__ = ["evidence_of", "VERDICTS", "CONFIDENCES", "FACT_TYPES", "CLEARED"]
