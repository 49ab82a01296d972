"""Compare two models node by node: dump both, pair tensors, score, name the first failing node.

    from opdiff.onnx import compare_models, RuntimeOptions
    cmp = compare_models("model.onnx", "model_fp16.onnx", inputs="x.npy", output_path="./out")
    cmp.first_divergence          # None, or the first failing node in golden topological order
    cmp.result                    # the shared CompareResult (kind="node" rows, title "opdiff onnx")

Both sides land in the store format under OUT/onnx_dump_{timestamp}/{golden,target}; the
verdict follows msit's five thresholds (policy.py) on the shared metrics (scoring.py); OUT also gets msit's CSV
(result_{timestamp}.csv), onnx_details.json (observer check, input notes, unmatched tensors,
timings) and the shared summary.json / report.html.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Optional

from ..comparison.result import ERROR
from ..store.records import SCHEMA_VERSION, json_text
from .deps import require
from .dumping import write_onnx_dump
from .graph import GraphIndex
from .inputs import prepare_inputs
from .matching import match_graphs
from .msit_csv import write_msit_csv
from .policy import MsitPolicy, MsitThresholds
from .runner import RuntimeOptions, load_model, run_model
from .scoring import TITLE, ModelComparison, Side, locate, score

log = logging.getLogger("opdiff")


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
    policy = MsitPolicy(thresholds)
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
    cmp = score(golden_side, target_side, matching, policy, prepared.notes)
    cmp.local_check = locate(cmp, t_model, t, golden_side, target_side, target_options, policy)
    clock["compare"] = time.perf_counter()
    with contextlib.ExitStack() as held:   # OUT is held from the dumps to the reports
        if output_path is not None:
            keep = [golden, target, *prepared.sources.values()]
            out, root, stamp = output_folder(held, output_path, keep)
            meta = {"tool": TITLE, "inputs": prepared.sources}
            cmp.dumps["golden"] = dump_side(root, "golden", g, g_run, golden, golden_options, meta,
                                            save_tensors)
            cmp.dumps["target"] = dump_side(root, "target", t, t_run, target, target_options, meta,
                                            save_tensors)
            clock["dump"] = time.perf_counter()
        finish(cmp, clock)
        annotate(cmp)
        if output_path is not None:
            write_outputs(cmp, out, stamp)
    return cmp


def output_folder(held: contextlib.ExitStack, output_path, keep) -> tuple:
    """(OUT, the onnx_dump_{stamp} folder for this run's dumps, stamp). OUT is held by the
    shared output owner until `held` closes: what opdiff wrote there the last time (CSVs, dumps,
    reports) is removed, the user's files and `keep` (the models and input files) are not; the
    dump folder is created and recorded before anything is written into it, so an interrupted
    run's folder is recognised too."""
    from ..report import outputs

    out = held.enter_context(outputs.session(output_path, keep=[str(k) for k in keep]))
    outputs.remember(out, [out / n for n in ("summary.json", "report.html", "rows.jsonl",
                                             "onnx_details.json")])
    stamp = time.strftime("%Y%m%d_%H%M%S")
    root = outputs.make_dir(fresh_path(out / f"onnx_dump_{stamp}"))
    return out, root, stamp


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
    while os.path.lexists(candidate):
        candidate = path.with_name(f"{path.stem}_{n}{path.suffix}")
        n += 1
    return candidate


# -- files --------------------------------------------------------------------------------------
def write_outputs(cmp: ModelComparison, out: Path, stamp: str) -> None:
    """msit's CSV and onnx_details.json here; summary.json, rows.jsonl and report.html from the
    shared writers (so `opdiff.report.summary.load_summary(OUT)` loads the result back).

    The msit CSV replaces the shared compare_result CSV: same rows, in the columns users of
    `msit debug compare` read, and without the shared CSV writer's torch import (seconds of
    start-up, more than the whole ONNX compare).
    """
    from ..report import outputs
    from ..report.html import write_html
    from ..report.rows import write_rows
    from ..report.summary import write_summary

    csv_path, details = fresh_path(out / f"result_{stamp}.csv"), out / "onnx_details.json"
    files = {"csv": str(csv_path), "summary": str(out / "summary.json"),
             "html": str(out / "report.html"), "rows": str(out / "rows.jsonl")}
    outputs.remember(out, [csv_path, details, *files.values()])
    cmp.files["msit_csv"] = str(write_msit_csv(csv_path, cmp.msit_rows))
    outputs.atomic_write_text(details, json_text({"schema_version": SCHEMA_VERSION, **details_of(cmp)},
                                                 indent=2), "onnx_details.json")
    cmp.files["details"] = str(details)
    write_rows(cmp.result.rows, files["rows"])
    cmp.result.files = dict(files)           # the summary and the page list every file written
    try:
        write_html(cmp.result, files["html"])
    except Exception as exc:  # the CSV and the summary are still worth having
        log.warning("opdiff: writing report.html failed (%s)", exc)
        files.pop("html")
        cmp.result.files = dict(files)
    write_summary(cmp.result, files["summary"])
    cmp.files.update(cmp.result.files)


def _finite(v):
    """A metric as onnx_details.json keeps it: `json_text` spells the non-finite ones."""
    return v


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
