"""Score matched tensor pairs with the shared metrics and msit's policy; name the first failing node.

    cmp = score(golden_side, target_side, matching, MsitPolicy(), notes)   # rows + msit rows
    cmp.local_check = locate(cmp, target_model, t_index, golden_side, target_side, options, policy)
    cmp.first_divergence          # the first failing node output in golden topological order

Every number and verdict comes from `MsitPolicy.judge_arrays`: the shared metrics (their numpy
twin, `opdiff.comparison.metrics_numpy`, one table of definitions with the dump compare's) judged
by msit's rule, the same `MsitPolicy` a dump compare of the written dumps applies with
`compare_pair(..., policy=MsitPolicy())`. What is
ONNX's own: pairs come from the graph matching (converter renames, folds), not from record
alignment, and the culprit is msit's first failing node, checked by running it alone.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ..comparison.result import (ERROR, INTEGER, LOCAL, NONFINITE, PASS, UNMATCHED, WARNING,
                                 CompareResult, Divergence, TensorRow)
from ..comparison import result as result_module
from ..comparison.reasons import source_context
from ..dtypes import is_exact
from ..store.schema import Kind, Phase, Role
from .dumping import stats_of
from .graph import GraphIndex
from .locate import LocalCheck, check_node_locally
from .matching import Matching
from .msit_csv import MsitRow
from .policy import MsitPolicy
from .runner import ObserverCheck, RuntimeOptions

TITLE = "opdiff onnx"


@dataclass
class ModelComparison:
    """Everything one model compare found; `result` is what the shared reports read."""
    result: CompareResult
    msit_rows: list
    matching: Matching
    observer: dict                       # side -> ObserverCheck
    input_notes: list
    local_check: Optional[LocalCheck] = None
    seconds: dict = field(default_factory=dict)
    dumps: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)

    @property
    def first_divergence(self) -> Optional[Divergence]:
        return self.result.first_divergence


@dataclass
class Side:
    """One side of a compare once it has run: its tensors and how to name and place them."""
    label: str                           # what the user passed (path, or file.py:function)
    tensors: dict
    observer: Optional[ObserverCheck]
    index: Optional[GraphIndex] = None   # None for the PyTorch side


def score(golden: Side, target: Side, matching: Matching, policy: MsitPolicy,
          notes: list) -> ModelComparison:
    """Metrics and verdict for every pair, and unmatched rows (pairs first, in matching order)."""
    rows, msit_rows = [], []
    t = target.index
    outputs = set(t.outputs) if t is not None else set()
    for pair in matching.pairs:
        tv, gv = target.tensors[pair.target], golden.tensors[pair.golden]
        m, verdict = policy.judge_arrays(tv, gv)
        metrics = dict(m.metrics) if m is not None else {}
        reason = verdict.reason
        if m is not None and m.message and m.message not in reason:
            reason = f"{reason}; {m.message}" if reason else m.message
        t_node = t.producer.get(pair.target) if t is not None else None
        t_name, t_location, t_module = pair.target, None, None
        if t is not None and t_node is not None:
            t_name, t_location, t_module = t.display_name(t_node), t.location_of(t_node), t.module_of(t_node)
        location = pair.location or t_location
        module = pair.module or t_module
        rows.append(TensorRow(
            target_name=pair.target, golden_name=pair.golden, op_name=pair.golden_node or t_name,
            role=pair.role, phase=Phase.FORWARD, kind=Kind.NODE, index=pair.order,
            target_dtype=str(tv.dtype), golden_dtype=str(gv.dtype), target_shape=tuple(tv.shape),
            golden_shape=tuple(gv.shape), metrics=metrics, target_stats=stats_of(tv),
            golden_stats=stats_of(gv), result=verdict.result,
            accuracy_reached=verdict.accuracy_reached,
            reason=f"matched by {pair.rule}" + (f"; {reason}" if reason else ""), module=module,
            stack=(location,) if location else (), mode=m.mode if m is not None else "tensor",
            error=m.error if m is not None else None,
            scale_error=m.scale_error if m is not None else None))
        out_index = list(t_node.output).index(pair.target) if t_node is not None else 0
        msit_rows.append(MsitRow(
            op_type=pair.golden_op or (t_node.op_type if t_node is not None else ""),
            target_node=t_name, target_dtype=str(tv.dtype), golden_node=pair.golden_node or pair.golden,
            golden_dtype=str(gv.dtype), tensor_index=f"{t_name}:output:{out_index}",
            shape=str(list(tv.shape)), metrics={**metrics, **(m.extra if m is not None else {})},
            fail_reason=reason,
            is_output=pair.target in outputs, is_error=verdict.result == ERROR,
            target_tensor=pair.target, golden_tensor=pair.golden, rule=pair.rule, module=module or "",
            location=f"{location.file}:{location.line}" if location else ""))
    for name, reason in matching.unmatched_golden:
        rows.append(TensorRow(target_name=None, golden_name=name, op_name=name, role=Role.OUTPUT,
                              phase=Phase.FORWARD, kind=Kind.NODE, index=-1, result=UNMATCHED,
                              reason=reason))
    for name, reason in matching.unmatched_target:
        rows.append(TensorRow(target_name=name, golden_name=None, op_name=name, role=Role.OUTPUT,
                              phase=Phase.FORWARD, kind=Kind.NODE, index=-1, result=UNMATCHED,
                              reason=reason))
    counts = {k: sum(r.result == k for r in rows) for k in (PASS, WARNING, ERROR, UNMATCHED)}
    result = CompareResult(target=target.label, golden=golden.label, rows=rows, first_divergence=None,
                           counts=counts, title=TITLE)
    return ModelComparison(result=result, msit_rows=msit_rows, matching=matching,
                           observer={"golden": golden.observer, "target": target.observer},
                           input_notes=list(notes))


def first_failing(cmp: ModelComparison) -> Optional[int]:
    """Index (into matching.pairs / the first rows) of the first failing node output, in golden order."""
    for i, pair in enumerate(cmp.matching.pairs):
        if pair.role == Role.OUTPUT and cmp.result.rows[i].result == ERROR:
            return i
    return None


def locate(cmp: ModelComparison, t_model, t: GraphIndex, golden: Side, target: Side,
           options: RuntimeOptions, policy: MsitPolicy) -> Optional[LocalCheck]:
    """Set result.first_divergence and run the target node that wrote it on the golden's inputs."""
    i = first_failing(cmp)
    if i is None:
        return None
    pair = cmp.matching.pairs[i]
    by_target = {p.target: p for p in cmp.matching.pairs}
    node = t.producer.get(pair.target)
    weights = [x for x in (node.input if node is not None else []) if x and x in t.initializers]
    differing = [r for r in cmp.result.rows[:len(cmp.matching.pairs)]
                 if r.target_name in weights and r.result == ERROR]
    if differing:       # the node computed on weights that differ: they are the origin
        set_initializer_divergence(cmp, i, differing[0])
        return None
    inputs = [x for x in (node.input if node is not None else []) if x and x not in t.initializers]
    golden_inputs = {x: golden.tensors[by_target[x].golden] for x in inputs if x in by_target}
    local = None
    if node is not None:
        local = check_node_locally(t_model, t, pair.target, golden_inputs, golden.tensors[pair.golden],
                                   target.tensors, options, policy)
    set_divergence(cmp, i, [by_target[x] for x in inputs if x in by_target], local)
    return local


def set_divergence(cmp: ModelComparison, i: int, input_pairs: list, local: Optional[LocalCheck]) -> None:
    """Make pair i (a failing node output) the result's first divergence, with its worst input."""
    pair, row = cmp.matching.pairs[i], cmp.result.rows[i]
    rows_by_target = {r.target_name: r for r in cmp.result.rows[:len(cmp.matching.pairs)]}
    worst_input: dict = {}
    for p in input_pairs:
        r = rows_by_target.get(p.target)
        # a one-element input has no cosine: it cannot be the worst by cosine
        if r is not None and r.metrics.get("Cosine") is not None and \
                (not worst_input or _cos(r.metrics) < _cos(worst_input)):
            worst_input = r.metrics
    verdict = row.reason.split("; ", 1)[-1]
    reason = f"first node in topological order whose output fails msit's thresholds: {verdict}"
    if worst_input:
        reason += f" (its worst input has cosine {_cos(worst_input):.6g})"
    if local is not None:
        reason += f"; {local.sentence}"
    location = row.stack[0] if row.stack else None
    cmp.result.first_divergence = Divergence(
        name=pair.golden_node or row.op_name, op=pair.golden_op, phase=Phase.FORWARD, reason=reason,
        location=location, metrics=row.metrics, tensor=pair.target,
        input_metrics=worst_input, module=row.module, context=_context(location),
        kind=_kind(row))


def set_initializer_divergence(cmp: ModelComparison, i: int, weight: TensorRow) -> None:
    """The first failing node (pair i) reads an initializer that already fails: the models do
    not hold the same weights, and the initializer is the origin ("parameter"), not the node."""
    pair, row = cmp.matching.pairs[i], cmp.result.rows[i]
    verdict = weight.reason.split("; ", 1)[-1]
    reason = (f"initializer {weight.target_name} differs before any node reads it ({verdict}): "
              f"the models do not hold the same weights; first read by "
              f"{pair.golden_node or row.op_name}, whose output fails only because of it")
    location = row.stack[0] if row.stack else None
    fields = {f.name for f in dataclasses.fields(Divergence)}
    extra: dict[str, Any] = {"origin": "parameter"} if "origin" in fields else {}
    cmp.result.first_divergence = Divergence(
        name=pair.golden_node or row.op_name, op=pair.golden_op, phase=Phase.FORWARD,
        reason=reason, location=location, metrics=weight.metrics, tensor=weight.target_name,
        input_metrics={}, module=row.module, context=_context(location),
        kind=getattr(result_module, "LEAF_KIND", "leaf"), **extra)


def _kind(row: TensorRow) -> str:
    """Why the node is named, for machines: inf/NaN where the golden has none (the only case
    with an infinite error), integers that differ, else a metric past msit's threshold."""
    if row.error is not None and math.isinf(row.error):
        return NONFINITE
    if is_exact(row.target_dtype) and is_exact(row.golden_dtype):
        return INTEGER
    return LOCAL


# Source files this process itself runs the user's model from (`torch_side._user_frame` adds
# them): their lines may be shown. A file an ONNX model or a dump merely names is never read.
LIVE_SOURCES: set[str] = set()


def _context(location, around: int = 2) -> tuple:
    """(line number, text) around the culprit's line, for a file this process runs the user's
    model from (`LIVE_SOURCES`); none read from a file a model or dump names
    (`comparison.reasons.source_context`; the line itself is `location.code`)."""
    if location is None or location.file not in LIVE_SOURCES or location.line < 1:
        return source_context(location, around)
    import linecache

    lines = range(max(1, location.line - around), location.line + around + 1)
    return tuple((n, linecache.getline(location.file, n).rstrip("\n")) for n in lines
                 if linecache.getline(location.file, n))


def _cos(metrics: dict) -> float:
    c = metrics.get("Cosine")
    return -math.inf if c is None or (isinstance(c, float) and math.isnan(c)) else c


__all__ = ["ModelComparison", "Side", "TITLE", "score", "first_failing", "locate",
           "set_divergence", "set_initializer_divergence"]
