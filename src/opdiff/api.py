"""The public facade: what `import opdiff` users call, wired from the pipeline's stages.

    import opdiff
    with opdiff.dump(model, "./dump/cpu", level="mix", task="tensor"):
        loss_fn(model(x), y).backward()
    result = opdiff.compare("./dump/npu", "./dump/cpu", output_path="./out")
    result.first_divergence      # None, or the op to blame with its source line

`compare` discovers the dumps on both sides (`opdiff.store.adapters`), runs the comparison
(`opdiff.comparison`) and writes the reports (`opdiff.report`); the stages never call each
other backwards.
"""
from __future__ import annotations

import os
from dataclasses import replace

from .capture.debugger import PrecisionDebugger, dump
from .comparison.layouts.declared import LayoutFile
from .comparison.layouts.declared import load as load_layout
from .comparison.mapping import Mapping
from .comparison.mapping import load as load_mapping
from .comparison.tokens.given import TokenIds, load_token_ids
from .comparison.options import CompareOptions
from .comparison.pair import compare_pair
from .comparison.plans import arrange
from .comparison.ranks import attribute_collectives
from .comparison.reasons import with_context
from .comparison.result import ERROR, WARNING, CompareResult
from .comparison.engines import Engine, engine_for
from .comparison.runs import (count_records, cut_sides, merge, pair_dumps, split_incomplete,
                              unpaired)
from .comparison.noise_floor import NoiseFloor, noise_note
from .comparison.verdicts import Policy
from .errors import ConfigError, OpdiffError
from .report import write_outputs
from .report.console import Progress, verdict_line
from .store.adapters import discover


def compare(target, golden, output_path=None, *, thresholds=None, shape_flag: bool = False,
            fail_on: str | None = None, progress: bool | None = None,
            replay: str = "auto", engine: str | Engine = "local",
            replay_jobs: int | None = None,
            source_root: str | os.PathLike[str] | None = None,
            mapping: str | os.PathLike[str] | Mapping | None = None,
            token_ids: str | os.PathLike[str] | TokenIds | None = None,
            layout: str | os.PathLike[str] | LayoutFile | None = None,
            golden_layout: str | os.PathLike[str] | LayoutFile | None = None,
            ray_address: str | None = None, ray_pins: dict | None = None,
            ray_shard_mb: float | None = None,
            noise: str | os.PathLike[str] | NoiseFloor | None = None) -> CompareResult:
    """Compare the target dump (the run under suspicion) with the golden (trusted) dump.

    target, golden: a step/rank directory or a dump root of any format opdiff reads; with roots
        holding several steps/ranks every (step, rank) pair is compared, ranks in parallel.
    output_path: a directory; when given, writes compare_result_{timestamp}.csv, summary.json
        and report.html there and lists them in `result.files`.
    thresholds: None, a dict, a JSON file path or a `Thresholds` (see `opdiff.comparison.verdicts`).
    shape_flag: pair ops only when their tensor shapes are equal.
    fail_on: None, "divergence" (a first divergence was found), "error" (any error row) or
        "warning" (any warning or error row): sets `result.failed` when it holds.
    progress: show a progress bar on stderr: None = when stderr is a terminal and the compare
        takes more than a second or so; True / False to force.
    replay: how much of the target to re-run in float64 on its own saved tensors to measure
        each op's own error (`opdiff.comparison.replay`; opdiff tensor dumps only): "auto" (default) the
        ops the comparison suspects and, when that is a backward op or nothing, the backward
        ops before it; "all" every op; "off" none (the comparison with golden alone).
    replay_jobs: processes each pair's replay uses (None: OPDIFF_REPLAY_JOBS, default 1; worth it
        when many ops are replayed and cores are idle: each process pays a torch start).
    engine: where the step/rank pairs are compared, the same result either way:
        `LocalEngine()` (also "local", the default: a process pool on this machine) or
        `RayEngine(address=, pins=, shard_mb=)` (also "ray", its defaults: each pair a Ray
        task; `pip install opdiff[ray]`), from `opdiff.comparison.engines`.
    ray_address, ray_pins, ray_shard_mb: deprecated (a DeprecationWarning; they go in the next
        release), with engine="ray" only: RayEngine's address, pins and shard_mb.
    source_root: a directory holding the source files of the run: the report shows the lines
        around the culprit's line from the file under it that the dump's call stack names
        (symlinks out of it are not followed). Without it, the lines the dump itself holds
        (opdiff's capture stores them): opdiff never reads a file just because a dump names it
        (SECURITY.md).
    mapping: a mapping file (YAML; msprobe's data_mapping.yaml and cell_mapping.yaml too; or
        one parsed by `opdiff.comparison.mapping.load`) for
        what dataflow cannot infer: module renames (`modules:`), ops to drop before alignment
        (`ignore:`), fused modules (`concat:`) and forced op pairs (`ops:`); see
        docs/howto/different-ops.md. A bad line raises `MappingError` naming
        the file and line; lines never used come back in `result.notes`. Not with the Ray
        engine.
    token_ids: a JSON file of each side's input ids (and masks), or one parsed by
        `opdiff.comparison.tokens.given.load_token_ids`, for dumps that did not save them
        (statistics dumps): how each side laid its tokens out; docs/howto/token-layouts.md.
    layout, golden_layout: the target's (golden's) layout file, or one parsed by
        `opdiff.comparison.layouts.declared.load`: which modules its ranks split by hand with
        plain tensors (column/row parallel); docs/howto/parallel-layouts.md. A bad line raises
        `LayoutError` naming the file and line.

    noise: a noise floor measured by `opdiff calibrate` (its directory, its noise_floor.json or
        a `NoiseFloor`): each tensor it measured is judged against max(dtype floor, k x its
        floor), k the threshold `noise_multiple` (3), and its rows say the multiple;
        docs/explanation/expected-error.md.

    Raises `DumpError` (an `OpdiffError`) for missing, empty or corrupt dumps and for dumps of
    different models.
    """
    if fail_on not in (None, "divergence", "error", "warning"):
        raise OpdiffError(f"fail_on must be None, 'divergence', 'error' or 'warning', not {fail_on!r}")
    options = CompareOptions(shape_flag=shape_flag, replay=replay, replay_jobs=replay_jobs)
    runner = engine_for(engine, ray_address=ray_address, ray_pins=ray_pins,
                        ray_shard_mb=ray_shard_mb)
    runner.check(mapping=mapping is not None)
    if output_path is not None:     # before a long compare: a user's summary.json is refused now
        from .report.outputs import check_free
        if os.path.lexists(output_path) and not os.path.isdir(output_path):
            raise ConfigError(f"{os.fspath(output_path)} is a file; pass a directory for the "
                              "output")
        check_free(output_path, ("summary.json", "report.html", "rows.jsonl"))
    if source_root is not None and not os.path.isdir(source_root):
        raise OpdiffError(f"source_root {os.fspath(source_root)!r} is not a directory; name the "
                          "directory that holds the run's source files")
    parsed = None
    if mapping is not None:
        parsed = mapping if isinstance(mapping, Mapping) else load_mapping(mapping)
    floor = noise if noise is None or isinstance(noise, NoiseFloor) else NoiseFloor.load(noise)
    given = token_ids if token_ids is None or isinstance(token_ids, TokenIds) else \
        load_token_ids(token_ids)
    t_layout, g_layout = (x if x is None or isinstance(x, LayoutFile) else load_layout(x)
                          for x in (layout, golden_layout))
    options = replace(options, policy=Policy(thresholds, floor), mapping=parsed,   # (made once)
                      token_ids=given, layout=t_layout, golden_layout=g_layout)
    targets, goldens = discover(target), discover(golden)
    targets, goldens, arranged = arrange(targets, goldens,  # the plan table's SOURCES rows
                                         options=options)
    pairs, notes = pair_dumps(targets, goldens)
    notes = [*arranged, *notes, *noise_note(floor, options.policy)]
    pairs, incomplete = split_incomplete(pairs)     # ranks that crashed before a step's first op
    incomplete += unpaired(targets, goldens)        # (pair_dumps notes these)
    cut, damage = cut_sides(pairs)                  # a side killed mid-step, or its disk full
    total = sum(count_records(t) for t, _ in pairs)
    with Progress(total, progress, pairs=len(pairs)) as bar:
        results = runner.run(pairs, options, tick=bar.advance, on_pair=bar.pair_done)
    results = attribute_collectives(results, pairs)     # received through a collective
    # (the pairing's notes travel in result.notes: the console prints them, once)
    result = merge(str(target), str(golden), results, notes + damage, incomplete=incomplete,
                   cut=cut)
    _add_context(result, source_root)
    result.verdict = verdict_line(result)
    result.failed = _failed(result, fail_on)
    if output_path is not None:
        result.files = write_outputs(result, output_path)
    return result


def _add_context(result: CompareResult, source_root: str | os.PathLike[str] | None) -> None:
    """The source lines around each first divergence's line: those its dump holds, or those of
    the file under `source_root` (`comparison.reasons.source_context`)."""
    done = {}
    for p in result.pairs:
        first = p.get("first_divergence")
        if first is not None:
            p["first_divergence"] = done[id(first)] = with_context(
                first, source_root, (p.get("target"), p.get("golden")))
    first = result.first_divergence
    if first is not None:
        result.first_divergence = done.get(id(first)) or with_context(
            first, source_root, (result.target, result.golden))


def _failed(result: CompareResult, fail_on: str | None) -> bool:
    if fail_on == "divergence":
        return result.first_divergence is not None
    if fail_on == "error":
        return result.counts.get(ERROR, 0) > 0
    if fail_on == "warning":
        return result.counts.get(ERROR, 0) + result.counts.get(WARNING, 0) > 0
    return False


__all__ = ["compare", "compare_pair", "dump", "PrecisionDebugger"]
