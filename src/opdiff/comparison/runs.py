"""Many step/rank pairs: pair the dumps of two roots, compare them in parallel, merge.

    from opdiff.comparison.runs import pair_dumps, split_incomplete, run_pairs, merge
    pairs, notes = pair_dumps(discover(target), discover(golden))
    pairs, incomplete = split_incomplete(pairs)     # a rank that crashed before its first op
    result = merge(target, golden, run_pairs(pairs, CompareOptions(), tick=print), notes,
                   incomplete=incomplete)

A pair whose target or golden directory holds no op records yet (a run killed just as a step
began) is not compared; it is named in `result.notes` and in `result.pairs` (its entry carries
`"incomplete": {"side", "why"}`), and every other pair is compared as usual. Only when no pair
is left is it an error.

A side whose step was cut (`cut_sides`: the run was killed mid-step, or its disk filled; the
reader knows from the step's `unfinished.json`) is compared up to where it ends; the pair's
entry carries `"cut": [{"side", "why", "records", "last_record", ("error")}]`, a note says
which step, rank and record, and summary.json lists it under "incomplete" with
`"compared": true`. An unreadable tensor shard is a note too (its tensors are compared by their statistics).

With several pairs, each pair's rows stay on disk (`spool.py`): the worker writes them to a
spool file and sends back its outcome only, and the merged result's `rows` streams those files,
so the driver's memory does not grow with the number of ranks. The result is the same, row for
row, as when every row was held in memory.

A worker process that dies (a kernel crash, the OOM killer) breaks its pool: its pairs are
compared again, each in a process of its own, then, if that dies too, without replay, with one
note per pair (`_died_note`); a replay worker that dies under a pair (`BrokenProcessPool` out of
`compare_pair`) makes the same pair go again without replay. SIGTERM/SIGHUP while a spool lives
end the process as an exit (`spool.Spool`): the workers started here are stopped first.

The presentation (verdict line, progress bar, files) is the caller's: see `opdiff.api.compare`.
"""
from __future__ import annotations

import logging
import os
import contextlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Optional, Sequence, Union, cast

from typing_extensions import TypedDict

from ..errors import DumpError
from ..store.reader import Cut, Dump
from ..store.source import DumpSource
from .options import CompareOptions
from .origins import across_steps, is_carried_over
from .ranks import received_from
from .result import CompareResult, Divergence, Note, Origin, TensorRow, count, reworded
from .spool import ChainedRows, PairRows, Spool, SpoolFile, encode_pair, on_disk, write_pair
from .workers import watch_parent

if TYPE_CHECKING:     # (runs.py stays free of torch: the CSV writer imports it)
    from .metrics import Measurement
    from .shards import KeyPair

log = logging.getLogger("opdiff")

Pair = tuple[DumpSource, DumpSource]


class _Place(TypedDict):
    step: Optional[int]
    rank: Optional[int]
    side: str                   # "target", "golden" or "both"
    why: str


class Incomplete(_Place, total=False):
    """A step/rank pair that is not (wholly) compared: a side missing, empty or cut short."""
    records: int                # cut: as `Dump.cut` says
    last_record: Optional[str]
    error: str
    compared: bool              # cut after some records: those were compared


_CUT_KEYS: tuple[Literal["side", "why", "records", "last_record", "error"], ...] = (
    "side", "why", "records", "last_record", "error")

EMPTY_WHY = "holds no op records (the run stopped before this step's first op?)"
MISSING_WHY = "has no directory for this step and rank"


def _key(d: DumpSource) -> tuple[int, int]:
    return (d.step if d.step is not None else -1, d.rank if d.rank is not None else -1)


def pair_dumps(targets: list[DumpSource],
               goldens: list[DumpSource]) -> tuple[list[Pair], list[str]]:
    """[(target, golden)] by (step, rank), and notes about the ones without a partner."""
    if len(targets) == 1 and len(goldens) == 1:
        return [(targets[0], goldens[0])], []
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
    if not pairs and (targets or goldens):     # (none at all: a plan left both out, noted)
        raise DumpError("no step/rank of the target dump has a counterpart in the golden dump; "
                        "point both paths at dumps of the same steps and ranks")
    return pairs, notes


def unpaired(targets: list[DumpSource], goldens: list[DumpSource]) -> list[Incomplete]:
    """The step/rank pairs only one side has, as incomplete entries (`pair_dumps` notes them)."""
    if len(targets) == 1 and len(goldens) == 1:
        return []
    t_keys, g_keys = {_key(d) for d in targets}, {_key(d) for d in goldens}
    out: list[Incomplete] = []
    for other, side, dumps in ((g_keys, "golden", targets), (t_keys, "target", goldens)):
        out += [{"step": d.step, "rank": d.rank, "side": side, "why": MISSING_WHY}
                for d in dumps if _key(d) not in other]
    return out


def _cut(dump: DumpSource) -> Optional[Cut]:
    """Where an opdiff dump's step ends early (`Dump.cut`); None for a whole one or another format."""
    return dump.cut() if isinstance(dump, Dump) else None


_CUT_WORDS = {"killed": "the run was killed there (or is still writing)",
              "disk full": "the disk filled there",
              "write failed": "writing the dump failed there",
              "raised": "the run raised {error} there",
              "exited": "the run ended there without closing the step (no stop()/step())"}


_EMPTY_CUT = {"killed": "holds no op records: the run was killed before its first one (or is "
                         "still writing)",
              "disk full": "holds no op records: the disk filled before its first one",
              "write failed": "holds no op records: writing the dump failed before its first one",
              "raised": "holds no op records: the run raised {error} before its first one",
              "exited": "holds no op records: the run ended before its first one without "
                        "closing the step"}


def _said(words: dict[str, str], cut: Union[Cut, Incomplete]) -> str:
    """A cut's words, with the exception a run raised (`store/durable.py`) in them."""
    text = words.get(cut.get("why", ""), words["killed"])
    return text.replace("{error}", str(cut.get("error") or "an exception"))


def cut_words(side: str, cut: Union[Cut, Incomplete]) -> str:
    """"the target's disk filled at record 28 (after Tensor.add_.3.forward)" and the like."""
    after = f" (after {cut['last_record']})" if cut.get("last_record") else ""
    if cut.get("why") == "disk full":
        return f"the {side}'s disk filled at record {cut['records']}{after}"
    return f"the {side} dump was cut at record {cut['records']}{after}: {_said(_CUT_WORDS, cut)}"


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
        why = EMPTY_WHY if cut is None else _said(_EMPTY_CUT, cut)
        incomplete.append({"step": t.step, "rank": t.rank, "side": side, "why": why})
    if not complete and pairs:
        t, g = pairs[0]
        dump = t if _is_empty(t) else g
        cut = _cut(dump)
        if cut is not None:
            raise DumpError(f"{dump.path}: the dump {_said(_EMPTY_CUT, cut)}; dump again"
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


def _worker(target_path: str, golden_path: str, options: CompareOptions,
            spool_path: Optional[str] = None, measured: Optional[dict[KeyPair, Measurement]] = None
            ) -> tuple[CompareResult, SpoolFile, Optional[bytes]]:
    """Compare one pair in a worker; its rows go to `spool_path` (this machine's disk) or, when
    None, come back as the spool file's bytes (a remote task: the driver writes them).
    options: `CompareOptions.portable()`; measured: its tensor pairs measured already by shard
    tasks (`shards.py`)."""
    import torch

    torch.set_num_threads(1)  # the processes already use every core
    from ..store.adapters import discover

    t, g = discover(target_path)[0], discover(golden_path)[0]
    result = _compare(t, g, options, measured=measured)
    return spooled(result, spool_path)


def _compare(t: DumpSource, g: DumpSource, options: CompareOptions, **how: Any) -> CompareResult:
    """`compare_pair`; when a replay worker process dies under it (a kernel crash, the OOM
    killer), the pair again without replay, with a note that says so."""
    from .pair import compare_pair      # (torch: merge, which rejudge uses, needs none)

    try:
        return compare_pair(t, g, options, **how)
    except BrokenProcessPool:
        if options.replay == "off":
            raise
    result = compare_pair(t, g, replace(options, replay="off"), **how)
    return replace(result, notes=[*result.notes, _died_note(result, "a replay worker process")])


def _died_note(result: CompareResult, who: str) -> Note:
    return Note(f"step {result.step} rank {result.rank}: {who} died while this pair was replayed "
                f"(a crash or the OOM killer); the pair was compared again without replay",
                Note.REPLAY)


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
        p["cut"] = [{k: c[k] for k in _CUT_KEYS if k in c} for c in cut
                    if (c["step"], c["rank"]) == (p["step"], p["rank"])] or None
    pairs.sort(key=lambda p: (p["step"] if p["step"] is not None else -1,
                              p["rank"] if p["rank"] is not None else -1))
    return CompareResult(
        target=target, golden=golden, rows=rows, first_divergence=first, counts=counts,
        environment_diff=env, pairs=pairs, facts=[f for r in results for f in r.facts],
        token_errors=next((r.token_errors for r in results if r.token_errors), None),
        layouts=[f for r in results for f in r.layouts],
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
    if i["why"] in _EMPTY_CUT.values():     # cut before its first record: what it ran is unknown
        return Note(f"step {i['step']} rank {i['rank']}: inconclusive: the {side} {i['why']}; "
                    f"not compared", Note.INCONCLUSIVE)
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


def run_pairs(pairs: list[Pair], options: CompareOptions, *,
              tick: Optional[Callable[[int], None]] = None,
              on_pair: Optional[Callable[[Pair], None]] = None) -> list[CompareResult]:
    """Compare every (target, golden) pair: one in this process, several in a process pool
    (their rows spooled to disk, see the module docstring). Results in the order of `pairs`.

    tick: called with the number of op records done, for a progress bar.
    on_pair: called with each pair once it is done, in the order they finish.
    options: how every pair is judged (`options.CompareOptions`).
    """
    advance: Callable[[int], None] = tick or (lambda n: None)
    finished: Callable[[Pair], None] = on_pair or (lambda p: None)
    from .plans import judged, made_by_plan

    if len(pairs) == 1 or any(made_by_plan(d) for pair in pairs for d in pair):
        # (a side a SOURCES plan made, ranks merged into one run, is no dump a worker can open)
        out = []
        for t, g in pairs:
            with _children_stopped_on_exit():
                result = _compare(t, g, options, tick=advance)
            out.append(judged(result, t, g))    # (what the plan says of it: a piece's rank)
            finished((t, g))
        return out
    spool = Spool()
    results: list[Optional[CompareResult]] = [None] * len(pairs)
    todo = list(range(len(pairs)))
    # A worker that dies breaks its whole pool: its pairs go again, each in a pool of its own
    # (so one that kills its worker again takes no other with it), then without replay.
    portable = options.portable()
    tiers = [(portable, False, False), (portable, True, False)]
    if options.replay != "off":
        tiers.append((replace(portable, replay="off"), True, True))
    for how, alone, said in tiers:
        if todo:
            todo = _pool_pass(pairs, todo, alone, said, spool, results, advance, finished,
                              (how,), ())
    if todo:
        t = pairs[todo[0]][0]
        raise DumpError(f"comparing step {t.step} rank {t.rank} kills its worker process even "
                        f"without replay (a crash or the OOM killer); compare that pair alone "
                        f"with -v, or leave it out")
    return [r for r in results if r is not None]


def _pool_pass(pairs: list[Pair], todo: list[int], alone: bool, said: bool, spool: Spool,
               results: list[Optional[CompareResult]], advance: Callable[[int], None],
               finished: Callable[[Pair], None], args: tuple[Any, ...],
               more: tuple[Any, ...]) -> list[int]:
    """Compare the pairs `todo` in worker processes (one pool, or, `alone`, one pool each, as
    many at a time as there are cores); fill `results` (`said`: with a note that the pair's
    worker died with replay); return the pairs whose worker died."""
    import multiprocessing
    from concurrent.futures import as_completed

    workers = max(1, min(len(todo), os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")  # fork after torch starts threads can deadlock
    broken: list[int] = []
    groups = [todo[k:k + workers] for k in range(0, len(todo), workers)] if alone else [todo]
    for group in groups:
        pools = [ProcessPoolExecutor(max_workers=1 if alone else workers, mp_context=ctx,
                                     initializer=watch_parent, initargs=(os.getpid(),))
                 for _ in (group if alone else [0])]     # workers die with this process
        try:
            with _children_stopped_on_exit():     # before the shutdown, which waits for them
                where = {}
                for k, i in enumerate(group):
                    call: tuple[Any, ...] = (str(pairs[i][0].path), str(pairs[i][1].path), *args,
                                             spool.path_for(i), *more)
                    where[pools[k if alone else 0].submit(_worker, *call)] = i
                for fut in as_completed(where):
                    i = where[fut]
                    try:
                        compact, meta, _blob = fut.result()
                    except BrokenProcessPool:
                        broken.append(i)
                        continue
                    result = unspooled(compact, spool, meta)
                    if said:
                        result = replace(result, notes=[*result.notes,
                                                        _died_note(result, "its worker process")])
                    results[i] = result
                    advance(count_records(pairs[i][0]))
                    finished(pairs[i])
        finally:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)
    return sorted(broken)


@contextlib.contextmanager
def _children_stopped_on_exit() -> Iterator[None]:
    """Worker processes started inside the block are ended at once when the block is left by
    an exception (SIGTERM's SystemExit, Ctrl-C): a pool's shutdown would wait for their work."""
    import multiprocessing

    before = set(multiprocessing.active_children())
    try:
        yield
    except BaseException:
        for child in set(multiprocessing.active_children()) - before:
            child.terminate()
        raise

__all__ = ["pair_dumps", "unpaired", "split_incomplete", "cut_sides", "cut_words", "run_pairs",
           "merge", "count_records", "spooled", "unspooled"]
