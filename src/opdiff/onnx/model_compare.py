"""Compare two models node by node: dump both, pair tensors, score, name the first failing node.

    from opdiff.onnx import compare_models, RuntimeOptions
    cmp = compare_models("model.onnx", "model_fp16.onnx", inputs="x.npy", output_path="./out")
    cmp.first_divergence          # None, or the first failing node in golden topological order
    cmp.result                    # the shared CompareResult (kind="node" rows, title "opdiff onnx")

Both sides land in the store format under OUT/onnx_dump_{timestamp}/{golden,target}; the
verdict follows msit's five thresholds (see metrics.py); OUT also gets msit's CSV
(result_{timestamp}.csv), onnx_details.json (observer check, input notes, unmatched tensors,
timings) and the shared summary.json / report.html.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


from ..comparison.result import ERROR, PASS, UNMATCHED, WARNING, CompareResult, Divergence, TensorRow
from .deps import require
from .dumping import stats_of, write_onnx_dump
from .graph import GraphIndex
from .inputs import prepare_inputs
from .locate import LocalCheck, check_node_locally
from .matching import Matching, match_graphs
from .metrics import MsitThresholds, compare_arrays
from .msit_csv import MsitRow, write_msit_csv
from .runner import ObserverCheck, RuntimeOptions, load_model, run_model

log = logging.getLogger("opdiff")

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


def compare_models(golden, target, *, inputs=None, output_path=None,
                   golden_options: Optional[RuntimeOptions] = None,
                   target_options: Optional[RuntimeOptions] = None, input_shapes=None, seed: int = 0,
                   thresholds: Optional[MsitThresholds] = None, save_tensors: bool = True) -> ModelComparison:
    """Run golden and target ONNX models on the same inputs and compare every matched tensor.

    golden and target may be the same file with different RuntimeOptions (optimisation level,
    execution provider). inputs: comma-separated .npy/.npz/.bin files, a list, or None (random,
    seeded).
    """
    require()
    clock = {"start": time.perf_counter()}
    golden_options = golden_options or RuntimeOptions()
    target_options = target_options or RuntimeOptions()
    thresholds = thresholds or MsitThresholds()
    g_model, t_model = load_model(golden), load_model(target)
    prepared = prepare_inputs(g_model, inputs, input_shapes=input_shapes, seed=seed)
    clock["load"] = time.perf_counter()
    g_run = run_model(g_model, golden, prepared.feeds, golden_options)
    t_run = run_model(t_model, target, feeds_for(t_model, prepared, "target"), target_options)
    clock["run"] = time.perf_counter()
    g, t = GraphIndex(g_model), GraphIndex(t_model)
    matching = match_graphs(g, t, g_run.tensors, t_run.tensors)
    golden_side = Side(f"{golden} ({golden_options.describe()})", g_run.tensors, g_run.observer, g)
    target_side = Side(f"{target} ({target_options.describe()})", t_run.tensors, t_run.observer, t)
    cmp = score(golden_side, target_side, matching, thresholds, prepared.notes)
    cmp.local_check = locate(cmp, t_model, t, golden_side, target_side, target_options, thresholds)
    clock["compare"] = time.perf_counter()
    if output_path is not None:
        stamp = time.strftime("%Y%m%d_%H%M%S")
        root = fresh_path(Path(output_path) / f"onnx_dump_{stamp}")
        meta = {"tool": TITLE, "inputs": prepared.sources}
        cmp.dumps["golden"] = dump_side(root, "golden", g, g_run, golden, golden_options, meta,
                                        save_tensors)
        cmp.dumps["target"] = dump_side(root, "target", t, t_run, target, target_options, meta,
                                        save_tensors)
        clock["dump"] = time.perf_counter()
    finish(cmp, clock)
    annotate(cmp)
    if output_path is not None:
        write_outputs(cmp, Path(output_path), stamp)
    return cmp


def dump_side(root: Path, side: str, graph, run, model, options, meta: dict, save_tensors) -> str:
    """Write one ONNX Runtime side's tensors as an opdiff dump under root/side; its path."""
    return str(write_onnx_dump(root / side, graph, run.tensors, {
        **meta, "side": side, "model": str(model), "runtime": options.describe(),
        "observer": run.observer.summary()}, save_tensors))


def annotate(cmp: ModelComparison) -> None:
    """The one-line verdict and the notes the shared reports show (observer check, inputs, matching)."""
    r, d = cmp.result, cmp.result.first_divergence
    if d is not None:
        module = f" in module {d.module}" if d.module else ""
        r.verdict = f"first failing node {d.name} ({d.op}){module}: {d.reason}"
    elif r.counts.get(ERROR):
        r.verdict = ("no node output fails msit's thresholds; only weights or constants differ beyond "
                     "them (expected for converted weights)")
    else:
        r.verdict = "no failing node: every matched tensor passes msit's thresholds"
    notes = []
    for side, obs in cmp.observer.items():
        if obs is not None:
            notes.append(f"observer check ({side}): {obs.summary()}")
    notes += cmp.input_notes
    rules = ", ".join(f"{n} by {rule}" for rule, n in cmp.matching.rules().items())
    notes.append(f"matched {len(cmp.matching.pairs)} tensors ({rules}); unmatched: "
                 f"{len(cmp.matching.unmatched_golden)} golden, {len(cmp.matching.unmatched_target)} "
                 f"target, with reasons in onnx_details.json")
    r.notes = notes


def feeds_for(model, prepared, side: str) -> dict:
    """The prepared feeds cast to this model's input dtypes (an fp16 model without fp32 I/O takes
    fp16 inputs); each cast is added to the notes."""
    from .deps import OnnxError
    from .inputs import model_inputs, numpy_dtype

    feeds = {}
    for info in model_inputs(model):
        if info.name not in prepared.feeds:
            raise OnnxError(f"the {side} model has an input '{info.name}' the golden does not have; "
                            f"both models must take the same inputs")
        value = prepared.feeds[info.name]
        dtype = numpy_dtype(info.elem_type)
        if value.dtype != dtype:
            prepared.notes.append(f"{info.name}: cast from {value.dtype} to {dtype} for the {side}")
            value = value.astype(dtype)
        feeds[info.name] = value
    return feeds


def finish(cmp: ModelComparison, clock: dict) -> None:
    end = time.perf_counter()
    marks = sorted(((k, v) for k, v in clock.items() if k != "start"), key=lambda kv: kv[1])
    prev = clock["start"]
    for k, v in marks:
        cmp.seconds[k] = round(v - prev, 4)
        prev = v
    cmp.seconds["total"] = round(end - clock["start"], 4)


def fresh_path(path: Path) -> Path:
    """A path that does not exist yet: a dump is append-only and must never mix two runs, and an
    earlier CSV is never overwritten."""
    candidate, n = path, 1
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}_{n}{path.suffix}")
        n += 1
    return candidate


# -- scoring ------------------------------------------------------------------------------------
def score(golden: Side, target: Side, matching: Matching, thresholds: MsitThresholds,
          notes: list) -> ModelComparison:
    """Metrics and verdict for every pair, unmatched rows, and the first failing node."""
    rows, msit_rows = [], []
    t = target.index
    outputs = set(t.outputs) if t is not None else set()
    for pair in matching.pairs:
        tv, gv = target.tensors[pair.target], golden.tensors[pair.golden]
        diff = compare_arrays(tv, gv)
        result, reason = thresholds.verdict(diff)
        t_node = t.producer.get(pair.target) if t is not None else None
        t_name = t.display_name(t_node) if t_node is not None else pair.target
        location = pair.location or (t.location_of(t_node) if t_node is not None else None)
        module = pair.module or (t.module_of(t_node) if t_node is not None else None)
        explained = f"matched by {pair.rule}" + (f"; {reason}" if reason else "")
        rows.append(TensorRow(
            target_name=pair.target, golden_name=pair.golden, op_name=pair.golden_node or t_name,
            role=pair.role, phase="forward", kind="node", index=pair.order,
            target_dtype=str(tv.dtype), golden_dtype=str(gv.dtype), target_shape=tuple(tv.shape),
            golden_shape=tuple(gv.shape), metrics=diff.metrics, target_stats=stats_of(tv),
            golden_stats=stats_of(gv), result=result, accuracy_reached="No" if result == ERROR else "Yes",
            reason=explained, module=module, stack=(location,) if location else (), error=diff.error))
        out_index = list(t_node.output).index(pair.target) if t_node is not None else 0
        msit_rows.append(MsitRow(
            op_type=pair.golden_op or (t_node.op_type if t_node is not None else ""),
            target_node=t_name, target_dtype=str(tv.dtype), golden_node=pair.golden_node or pair.golden,
            golden_dtype=str(gv.dtype), tensor_index=f"{t_name}:output:{out_index}",
            shape=str(list(tv.shape)), metrics=diff.msit, fail_reason=reason,
            is_output=pair.target in outputs, is_error=result == ERROR, target_tensor=pair.target,
            golden_tensor=pair.golden, rule=pair.rule, module=module or "",
            location=f"{location.file}:{location.line}" if location else ""))
    for name, reason in matching.unmatched_golden:
        rows.append(TensorRow(target_name=None, golden_name=name, op_name=name, role="output",
                              phase="forward", kind="node", index=-1, result=UNMATCHED, reason=reason))
    for name, reason in matching.unmatched_target:
        rows.append(TensorRow(target_name=name, golden_name=None, op_name=name, role="output",
                              phase="forward", kind="node", index=-1, result=UNMATCHED, reason=reason))
    counts = {k: sum(r.result == k for r in rows) for k in (PASS, WARNING, ERROR, UNMATCHED)}
    result = CompareResult(target=target.label, golden=golden.label, rows=rows, first_divergence=None,
                           counts=counts, title=TITLE)
    return ModelComparison(result=result, msit_rows=msit_rows, matching=matching,
                           observer={"golden": golden.observer, "target": target.observer},
                           input_notes=list(notes))


def first_failing(cmp: ModelComparison) -> Optional[int]:
    """Index (into matching.pairs / the first rows) of the first failing node output, in golden order."""
    for i, pair in enumerate(cmp.matching.pairs):
        if pair.role == "output" and cmp.result.rows[i].result == ERROR:
            return i
    return None


def locate(cmp: ModelComparison, t_model, t: GraphIndex, golden: Side, target: Side,
            options: RuntimeOptions, thresholds: MsitThresholds) -> Optional[LocalCheck]:
    """Set result.first_divergence and run the target node that wrote it on the golden's inputs."""
    i = first_failing(cmp)
    if i is None:
        return None
    pair = cmp.matching.pairs[i]
    by_target = {p.target: p for p in cmp.matching.pairs}
    node = t.producer.get(pair.target)
    inputs = [x for x in (node.input if node is not None else []) if x and x not in t.initializers]
    golden_inputs = {x: golden.tensors[by_target[x].golden] for x in inputs if x in by_target}
    local = None
    if node is not None:
        local = check_node_locally(t_model, t, pair.target, golden_inputs, golden.tensors[pair.golden],
                                   target.tensors, options, thresholds)
    set_divergence(cmp, i, [by_target[x] for x in inputs if x in by_target], local)
    return local


def set_divergence(cmp: ModelComparison, i: int, input_pairs: list, local: Optional[LocalCheck]) -> None:
    pair, row = cmp.matching.pairs[i], cmp.result.rows[i]
    rows_by_target = {r.target_name: r for r in cmp.result.rows[:len(cmp.matching.pairs)]}
    worst_input = {}
    for p in input_pairs:
        r = rows_by_target.get(p.target)
        if r is not None and (not worst_input or _cos(r.metrics) < _cos(worst_input)):
            worst_input = r.metrics
    verdict = row.reason.split("; ", 1)[-1]
    reason = f"first node in topological order whose output fails msit's thresholds: {verdict}"
    if worst_input:
        reason += f" (its worst input has cosine {_cos(worst_input):.6g})"
    if local is not None:
        reason += f"; {local.sentence}"
    location = row.stack[0] if row.stack else None
    cmp.result.first_divergence = Divergence(
        name=pair.golden_node or row.op_name, op=pair.golden_op, phase="forward", reason=reason,
        location=location, metrics=row.metrics, tensor=pair.target,
        input_metrics=worst_input, module=row.module, context=_context(location))


def _context(location, around: int = 2) -> tuple:
    """(line number, text) around the culprit's line, when the source file is on this machine."""
    if location is None or not location.line or not os.path.isfile(location.file):
        return ()
    import linecache

    lines = range(max(1, location.line - around), location.line + around + 1)
    return tuple((n, linecache.getline(location.file, n).rstrip("\n")) for n in lines
                 if linecache.getline(location.file, n))


def _cos(metrics: dict) -> float:
    c = metrics.get("Cosine")
    return -math.inf if c is None or (isinstance(c, float) and math.isnan(c)) else c


# -- files --------------------------------------------------------------------------------------
def write_outputs(cmp: ModelComparison, out: Path, stamp: str) -> None:
    """msit's CSV and onnx_details.json here; summary.json and report.html from the shared writers.

    The msit CSV replaces the shared compare_result CSV: same rows, in the columns users of
    `msit debug compare` read, and without the shared CSV writer's torch import (seconds of
    start-up, more than the whole ONNX compare).
    """
    out.mkdir(parents=True, exist_ok=True)
    cmp.files["msit_csv"] = str(write_msit_csv(fresh_path(out / f"result_{stamp}.csv"), cmp.msit_rows))
    details = out / "onnx_details.json"
    details.write_text(json.dumps(details_of(cmp), indent=2, allow_nan=False, default=str))
    cmp.files["details"] = str(details)
    files = {"csv": cmp.files["msit_csv"], "summary": str(out / "summary.json")}
    try:
        from ..report.summary import write_summary
    except ImportError:
        write_summary = None
    try:
        from ..report.html import write_html
    except ImportError:
        write_html = None
    if write_html is not None:
        files["html"] = str(out / "report.html")
    cmp.result.files = dict(files)           # the summary and the page list every file written
    if write_html is not None:
        try:
            write_html(cmp.result, out / "report.html")
        except Exception as exc:  # the CSV and the summary are still worth having
            log.warning("opdiff: writing report.html failed (%s)", exc)
            files.pop("html")
            cmp.result.files = dict(files)
    if write_summary is not None:
        write_summary(cmp.result, out / "summary.json")
    else:  # the shared report writer is not installed: a minimal summary.json per DESIGN.md
        (out / "summary.json").write_text(json.dumps(_summary(cmp), indent=2, allow_nan=False, default=str))
    cmp.files.update(cmp.result.files)


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def _summary(cmp: ModelComparison) -> dict:
    d = cmp.result.first_divergence
    first = None
    if d is not None:
        loc = d.location
        first = {"name": d.name, "op": d.op, "phase": d.phase, "reason": d.reason, "tensor": d.tensor,
                 "module": d.module,
                 "location": {"file": loc.file, "line": loc.line, "code": loc.code} if loc else None,
                 "metrics": {k: _finite(v) for k, v in d.metrics.items()}}
    return {"title": TITLE, "first_divergence": first, "counts": cmp.result.counts,
            "target": cmp.result.target, "golden": cmp.result.golden, "environment_diff": []}


def details_of(cmp: ModelComparison) -> dict:
    """The ONNX-specific facts the shared summary has no place for."""
    return {
        "observer": {side: {"changed": o.changed, "summary": o.summary(), "details": o.details}
                     for side, o in cmp.observer.items() if o is not None},
        "inputs": cmp.input_notes,
        "matching": {"rules": cmp.matching.rules(), "pairs": len(cmp.matching.pairs),
                     "unmatched_golden": [{"tensor": n, "reason": r} for n, r in cmp.matching.unmatched_golden],
                     "unmatched_target": [{"tensor": n, "reason": r} for n, r in cmp.matching.unmatched_target]},
        "local_check": None if cmp.local_check is None else {
            "node": cmp.local_check.node, "local_error": cmp.local_check.local_error,
            "sentence": cmp.local_check.sentence,
            "metrics": {k: _finite(v) for k, v in cmp.local_check.metrics.items()}},
        "dumps": cmp.dumps, "seconds": cmp.seconds,
    }
