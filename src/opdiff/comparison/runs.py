"""Many step/rank pairs: pair the dumps of two roots, compare them in parallel, merge.

    from opdiff.comparison.runs import pair_dumps, split_incomplete, run_pairs, merge
    pairs, notes = pair_dumps(discover(target), discover(golden))
    pairs, incomplete = split_incomplete(pairs)     # a rank that crashed before its first op
    result = merge(target, golden, run_pairs(pairs, Policy(), tick=print), notes,
                   incomplete=incomplete)

A pair whose target or golden directory holds no op records yet (a run killed just as a step
began) is not compared; it is named in `result.notes` and in `result.pairs` (its entry carries
`"incomplete": {"side", "why"}`), and every other pair is compared as usual. Only when no pair
is left is it an error.

A side whose step was cut (`cut_sides`: the run was killed mid-step, or its disk filled; the
reader knows from the step's `unfinished.json`) is compared up to where it ends; the pair's
entry carries `"cut": [{"side", "why", "records", "last_record"}]`, a note says which step,
rank and record, and summary.json lists it under "incomplete" with `"compared": true`. An
unreadable tensor shard is a note too (its tensors are compared by their statistics).

With several pairs, each pair's rows stay on disk (`spool.py`): the worker writes them to a
spool file and sends back its outcome only, and the merged result's `rows` streams those files,
so the driver's memory does not grow with the number of ranks. The result is the same, row for
row, as when every row was held in memory.

The presentation (verdict line, progress bar, files) is the caller's: see `opdiff.api.compare`.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence, cast

from ..errors import DumpError
from ..store.reader import Dump
from ..store.source import DumpSource
from . import layouts
from .mapping import Mapping
from .origins import across_steps, is_carried_over
from .ranks import received_from
from .result import CompareResult, Divergence, Note, Origin, TensorRow, count, reworded
from .spool import ChainedRows, PairRows, Spool, SpoolFile, encode_pair, on_disk, write_pair
from .verdicts import Policy, Thresholds
from .workers import watch_parent

log = logging.getLogger("opdiff")

Pair = tuple[DumpSource, DumpSource]
Incomplete = dict[str, Any]          # {"step", "rank", "side", "why"}

EMPTY_WHY = "holds no op records (the run stopped before this step's first op?)"
MISSING_WHY = "has no directory for this step and rank"


def _key(d: DumpSource) -> tuple[int, int]:
    return (d.step if d.step is not None else -1, d.rank if d.rank is not None else -1)


def pair_dumps(targets: list[DumpSource],
               goldens: list[DumpSource]) -> tuple[list[Pair], list[str]]:
    """[(target, golden)] by (step, rank), and notes about the ones without a partner."""
    if len(targets) == 1 and len(goldens) == 1:
        return [(targets[0], goldens[0])], []
    # -- comparison/layouts (issue 44): sides laid out unlike each other over ranks ----------
    logical = layouts.logical_pairs(targets, goldens)
    if logical is not None and logical[0]:
        return logical
    # -- (end of the layouts hook)
    g_by_key = {_key(d): d for d in goldens}
    pairs: list[Pair] = []
    notes: list[str] = []
    for t in targets:
        g = g_by_key.pop(_key(t), None)
        if g is None:
            notes.append(Note(f"target step {t.step} rank {t.rank} has no golden counterpart; "
                              f"skipped", Note.DUMPS))
        else:
            pairs.append((t, g))
    for g in g_by_key.values():
        notes.append(Note(f"golden step {g.step} rank {g.rank} has no target counterpart; skipped",
                          Note.DUMPS))
    notes += logical[1] if logical is not None else []     # (layouts: why not merged)
    if not pairs:
        raise DumpError("no step/rank of the target dump has a counterpart in the golden dump; "
                        "point both paths at dumps of the same steps and ranks")
    return pairs, notes


def unpaired(targets: list[DumpSource], goldens: list[DumpSource]) -> list[Incomplete]:
    """The step/rank pairs only one side has, as incomplete entries (`pair_dumps` notes them)."""
    if len(targets) == 1 and len(goldens) == 1:
        return []
    logical = layouts.logical_pairs(targets, goldens)      # (layouts: merged sides pair whole)
    if logical is not None and logical[0]:
        return []
    t_keys, g_keys = {_key(d) for d in targets}, {_key(d) for d in goldens}
    out: list[Incomplete] = []
    for other, side, dumps in ((g_keys, "golden", targets), (t_keys, "target", goldens)):
        out += [{"step": d.step, "rank": d.rank, "side": side, "why": MISSING_WHY}
                for d in dumps if _key(d) not in other]
    return out


def _cut(dump: DumpSource) -> Optional[dict[str, Any]]:
    """Where an opdiff dump's step ends early (`Dump.cut`); None for a whole one or another format."""
    return dump.cut() if isinstance(dump, Dump) else None


_CUT_WORDS = {"killed": "the run was killed there (or is still writing)",
              "disk full": "the disk filled there",
              "write failed": "writing the dump failed there"}


_EMPTY_CUT = {"killed": "holds no op records: the run was killed before its first one (or is "
                         "still writing)",
              "disk full": "holds no op records: the disk filled before its first one",
              "write failed": "holds no op records: writing the dump failed before its first one"}


def cut_words(side: str, cut: dict[str, Any]) -> str:
    """"the target's disk filled at record 28 (after Tensor.add_.3.forward)" and the like."""
    after = f" (after {cut['last_record']})" if cut.get("last_record") else ""
    if cut.get("why") == "disk full":
        return f"the {side}'s disk filled at record {cut['records']}{after}"
    return (f"the {side} dump was cut at record {cut['records']}{after}: "
            f"{_CUT_WORDS.get(cut.get('why', ''), _CUT_WORDS['killed'])}")


def cut_sides(pairs: list[Pair]) -> tuple[list[Incomplete], list[str]]:
    """The sides of pairs whose step ends early, as {"step", "rank", "side", "why": "killed" |
    "disk full" | "write failed", "records", "last_record", "compared": True}; and notes on
    unreadable tensor shards."""
    cut: list[Incomplete] = []
    notes: list[str] = []
    for t, g in pairs:
        for side, d in (("target", t), ("golden", g)):
            if not isinstance(d, Dump):
                continue
            where = d.cut()
            if where is not None:
                cut.append({"step": t.step, "rank": t.rank, "side": side, **where, "compared": True})
            d.tensor_keys()         # reads the shards' headers: which are unreadable
            notes += [Note(f"step {t.step} rank {t.rank}: the {side}'s {p}", Note.DUMPS)
                      for p in d.problems]
    return cut, notes


def _is_empty(dump: DumpSource) -> bool:
    """True when the dump holds no op record (reads at most its first one)."""
    return next(iter(dump.records()), None) is None


def split_incomplete(pairs: list[Pair]) -> tuple[list[Pair], list[Incomplete]]:
    """The pairs both of whose sides hold op records, and the others as
    {"step", "rank", "side": "target"|"golden"|"both", "why"}.

    A DumpError when no pair is left: with one pair, the reader's own words for it."""
    complete: list[Pair] = []
    incomplete: list[Incomplete] = []
    for t, g in pairs:
        empty = [side for side, d in (("target", t), ("golden", g)) if _is_empty(d)]
        if not empty:
            complete.append((t, g))
            continue
        side = empty[0] if len(empty) == 1 else "both"
        cut = _cut(t if empty[0] == "target" else g)
        why = EMPTY_WHY if cut is None else _EMPTY_CUT.get(cut["why"], _EMPTY_CUT["killed"])
        incomplete.append({"step": t.step, "rank": t.rank, "side": side, "why": why})
    if not complete:
        t, g = pairs[0]
        dump = t if _is_empty(t) else g
        cut = _cut(dump)
        if cut is not None:
            raise DumpError(f"{dump.path}: the dump "
                            f"{_EMPTY_CUT.get(cut['why'], _EMPTY_CUT['killed'])}; dump again"
                            + (" with more free space" if cut["why"] == "disk full" else ""))
        if len(pairs) == 1:
            raise DumpError(f"{dump.path}: the dump holds no op records; was the model run "
                            f"between start() and stop()?")
        raise DumpError(f"no step/rank pair can be compared: every one has a side that holds no "
                        f"op records (e.g. {dump.path}); was the model run between start() and "
                        f"stop()?")
    return complete, incomplete


def count_records(dump: DumpSource) -> int:
    """How many op records a dump holds, for a progress total (0 when it cannot tell cheaply)."""
    return int(dump.record_count())


def _worker(target_path: str, golden_path: str, thresholds: Thresholds, shape_flag: bool,
            replay: str = "auto", spool_path: Optional[str] = None,
            replay_jobs: Optional[int] = None, measured: Optional[dict[Any, Any]] = None,
            mapping: Optional[Mapping] = None
            ) -> tuple[CompareResult, SpoolFile, Optional[bytes]]:
    """Compare one pair in a worker; its rows go to `spool_path` (this machine's disk) or, when
    None, come back as the spool file's bytes (a remote task: the driver writes them).
    measured: its tensor pairs measured already by shard tasks (`shards.py`)."""
    import torch

    torch.set_num_threads(1)  # the processes already use every core
    from ..store.adapters import discover

    from .pair import compare_pair

    t, g = discover(target_path)[0], discover(golden_path)[0]
    result = compare_pair(t, g, policy=Policy(thresholds), shape_flag=shape_flag, replay=replay,
                          replay_jobs=replay_jobs, measured=measured, mapping=mapping)
    return spooled(result, spool_path)


def spooled(result: CompareResult, path: Optional[str]
            ) -> tuple[CompareResult, SpoolFile, Optional[bytes]]:
    """(the result without its rows, where its rows lie, the spool bytes when `path` is None)."""
    blob: Optional[bytes] = None
    if path is not None:
        meta = write_pair(result.rows, path, result.step, result.rank)
    else:
        blob, offsets = encode_pair(result.rows)
        meta = SpoolFile("", len(result.rows), offsets, result.step, result.rank)
    return replace(result, rows=[]), meta, blob


def unspooled(compact: CompareResult, spool: Spool, meta: SpoolFile) -> CompareResult:
    """A pair's result whose rows are read from its spool file (what `spooled` took apart)."""
    return replace(compact, rows=cast("list[TensorRow]", PairRows(spool, meta)))


def merge(target: str, golden: str, results: list[CompareResult], notes: list[str], *,
          incomplete: Sequence[Incomplete] = (), cut: Sequence[Incomplete] = ()) -> CompareResult:
    """One CompareResult for many pairs: rows tagged with their step and rank, the earliest
    first divergence, one `pairs` entry per step/rank pair (the incomplete ones included;
    `cut`: sides that end early, from `cut_sides`)."""
    across_steps(results)   # parameters changed between two agreeing steps: the optimizer (origins)
    if len(results) == 1 and not notes and not incomplete and not cut:
        return results[0]
    rows: list[TensorRow] = []
    if results and all(on_disk(r.rows) for r in results):
        # Streamed from the pairs' spool files, tagged as they are read: nothing is copied here.
        rows = cast("list[TensorRow]", ChainedRows(
            [cast(PairRows, r.rows).tagged_view() for r in results]))
        counts = count([])
        for r in results:
            for k, v in r.counts.items():
                counts[k] = counts.get(k, 0) + v
    else:
        for r in results:
            rows += [replace(row, step=r.step, rank=r.rank) for row in r.rows]
        counts = count(rows)
    divergent = [r for r in results if r.first_divergence is not None]
    # A difference a rank received through a collective is not where it started (ranks.py).
    local = [r for r in divergent if not received_from(r.first_divergence)]
    divergent = local or divergent
    first = None
    if divergent:
        # No clock is shared between ranks: earliest step first, then earliest op, then rank.
        best = min(divergent, key=lambda r: (r.step if r.step is not None else -1,
                                             _first_index(r), r.rank if r.rank is not None else -1))
        first = best.first_divergence
    env = results[0].environment_diff if results else []
    pairs = [_pair_summary(r) for r in results] + [_incomplete_summary(i) for i in incomplete]
    for p in pairs:
        p["cut"] = [{k: c[k] for k in ("side", "why", "records", "last_record")} for c in cut
                    if (c["step"], c["rank"]) == (p["step"], p["rank"])] or None
    pairs.sort(key=lambda p: (p["step"] if p["step"] is not None else -1,
                              p["rank"] if p["rank"] is not None else -1))
    return CompareResult(
        target=target, golden=golden, rows=rows, first_divergence=first, counts=counts,
        environment_diff=env, pairs=pairs,
        notes=[Note(f"step {c['step']} rank {c['rank']}: {cut_words(c['side'], c)}; what it ran "
                    f"after that was not recorded, so only its first {c['records']} records are "
                    f"compared", Note.DUMPS) for c in cut] +
        list(notes) + [_incomplete_note(i) for i in incomplete if i["why"] != MISSING_WHY] +
        _rank_notes(results, first) + _pair_notes(results))


def _rank_notes(results: list[CompareResult], first: Optional[Divergence]) -> list[str]:
    """Where the other ranks' differences come from: their own ops, or a collective."""
    own = [r for r in results if r.first_divergence is not None and r.first_divergence is not first
           and not received_from(r.first_divergence)
           and not is_carried_over(r.first_divergence)]
    got = [r for r in results if received_from(r.first_divergence)]
    carried = [r for r in results if r.first_divergence is not first
               and is_carried_over(r.first_divergence)]
    notes: list[str] = []
    if own:
        notes.append(Note("also diverging for their own reasons: " + "; ".join(
            f"step {r.step} rank {r.rank} at {r.first_divergence.name}" for r in own
            if r.first_divergence is not None), Note.RANKS))
    if carried:
        notes.append(Note("diverging because an earlier step did (their parameters already "
                          f"differ, origin {Origin.PARAMETER}): " + "; ".join(
                              f"step {r.step} rank {r.rank}" for r in carried), Note.RANKS))
    for r in got:
        if r.first_divergence is not None:
            notes.append(Note(f"step {r.step} rank {r.rank}: {r.first_divergence.reason}",
                              Note.RANKS))
    return notes


def _incomplete_note(i: Incomplete) -> str:
    side = "target and golden" if i["side"] == "both" else i["side"]
    return Note(f"step {i['step']} rank {i['rank']}: the {side} {i['why']}; not compared",
                Note.DUMPS)


def _pair_notes(results: list[CompareResult]) -> list[str]:
    """Each pair's notes, prefixed with where they hold; a note every pair has is said once."""
    where: dict[str, list[str]] = {}
    for r in results:
        for n in r.notes:
            where.setdefault(n, []).append(f"step {r.step} rank {r.rank}")
    return [n if len(places) == len(results) > 1 else reworded(n, f"{', '.join(places)}: {n}")
            for n, places in where.items()]


def _first_index(r: CompareResult) -> int:
    name = r.first_divergence.name if r.first_divergence is not None else None
    for row in r.rows:
        if row.op_name == name:
            return int(row.index)
    return 0


def _pair_summary(r: CompareResult) -> dict[str, Any]:
    """A pair's entry in `CompareResult.pairs`; its first_divergence is the Divergence itself
    (summary.json writes its fields)."""
    return {"step": r.step, "rank": r.rank, "target": r.target, "golden": r.golden,
            "counts": dict(r.counts), "first_divergence": r.first_divergence,
            "incomplete": None}


def _incomplete_summary(i: Incomplete) -> dict[str, Any]:
    return {"step": i["step"], "rank": i["rank"], "target": None, "golden": None, "counts": {},
            "first_divergence": None, "incomplete": {"side": i["side"], "why": i["why"]}}


def run_pairs(pairs: list[Pair], policy: Policy, *, shape_flag: bool = False,
              replay: str = "auto", replay_jobs: Optional[int] = None,
              tick: Optional[Callable[[int], None]] = None,
              on_pair: Optional[Callable[[Pair], None]] = None,
              mapping: Optional[Mapping] = None) -> list[CompareResult]:
    """Compare every (target, golden) pair: one in this process, several in a process pool
    (their rows spooled to disk, see the module docstring). Results in the order of `pairs`.

    tick: called with the number of op records done, for a progress bar.
    on_pair: called with each pair once it is done, in the order they finish.
    replay_jobs: processes each pair's replay uses (see `compare_pair`).
    mapping: a parsed mapping file (`mapping.load`), applied to every pair.
    """
    from .pair import compare_pair      # (torch: merge, which rejudge uses, needs none)

    advance: Callable[[int], None] = tick or (lambda n: None)
    finished: Callable[[Pair], None] = on_pair or (lambda p: None)
    if len(pairs) == 1 or any(layouts.is_logical(d) for pair in pairs for d in pair):
        # (a merged side of comparison/layouts cannot be opened again in a worker by its path)
        out = []
        for t, g in pairs:
            result = compare_pair(t, g, policy=policy, shape_flag=shape_flag, tick=advance,
                                  replay=replay, replay_jobs=replay_jobs, mapping=mapping)
            out.append(layouts.name_ranks(result, t, g))    # (layouts: the rank of a piece)
            finished((t, g))
        return out
    import multiprocessing
    from concurrent.futures import as_completed

    workers = max(1, min(len(pairs), os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")  # fork after torch starts threads can deadlock
    spool = Spool()
    results: list[Optional[CompareResult]] = [None] * len(pairs)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=watch_parent,
                             initargs=(os.getpid(),)) as pool:   # workers die with this process
        where = {pool.submit(_worker, str(t.path), str(g.path), policy.thresholds, shape_flag,
                             replay, spool.path_for(i), replay_jobs, None, mapping): i
                 for i, (t, g) in enumerate(pairs)}
        for fut in as_completed(where):
            i = where[fut]
            compact, meta, _blob = fut.result()
            results[i] = unspooled(compact, spool, meta)
            advance(count_records(pairs[i][0]))
            finished(pairs[i])
    return [r for r in results if r is not None]

__all__ = ["pair_dumps", "unpaired", "split_incomplete", "cut_sides", "cut_words", "run_pairs",
           "merge", "count_records", "spooled", "unspooled"]
