"""The compare engine: two dumps in, one CompareResult out.

    import opdiff
    result = opdiff.compare("./dump/npu", "./dump/cpu", output_path="./out")
    result.first_divergence      # None, or the op to blame with its source line

Steps: open both sides through `opdiff.store.adapters.discover` (opdiff, msprobe and legacy
dumps alike), pair step/rank directories, align each pair's op sequences
(`opdiff.compare.align`), measure every paired tensor (`opdiff.compare.metrics`, one pair of
tensors in memory at a time), give verdicts (`opdiff.compare.verdicts`) and find the first
divergence (`opdiff.compare.divergence`). Several step/rank pairs run in parallel processes.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Optional

from ..errors import DumpError, OpdiffError
from ..store.records import decoded_stats, iter_tensors
from .align import align
from .divergence import OpScore, analyse, count, differing_numbers, statistics_limits
from .envdiff import environment_diff
from .metrics import Measurement, measure, stats_measure
from .result import ERROR, PASS, UNMATCHED, WARNING, CompareResult, Location, TensorRow
from .verdicts import Policy, Thresholds

log = logging.getLogger("opdiff")

# Descriptor flags of tensors whose values mean nothing (capture's Describer.unread).
_UNREAD = {"overwritten": "overwritten by the op without being read: not compared",
           "uninitialized": "uninitialised memory (torch.empty): not compared"}

# Below this fraction of paired ops, two dumps are taken to be of different models.
MIN_PAIRED_FRACTION = 0.3


def _location(dump, record: dict) -> tuple:
    frames = dump.stack(record.get("stack")) if record.get("stack") is not None else []
    out = []
    for f in frames:
        try:
            out.append(Location(file=str(f.get("file", "")), line=int(f.get("line") or 0),
                                code=str(f.get("code") or ""), function=str(f.get("function") or "")))
        except (TypeError, ValueError, AttributeError):
            continue
    return tuple(out)


def _numel(shape) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n


def _load(dump, desc: dict):
    key = desc.get("key")
    if not key:
        return None
    try:
        return dump.tensor(key)
    except OpdiffError:
        raise
    except Exception as exc:  # an unreadable shard: compare the statistics instead
        log.warning("opdiff: cannot read tensor %s from %s (%s); using its statistics", key,
                    getattr(dump, "path", "?"), exc)
        return None


class _PairCompare:
    """Compares one target dump with one golden dump; see `compare_pair`."""

    def __init__(self, target_dump, golden_dump, policy: Policy, shape_flag: bool,
                 tick: Optional[Callable[[int], None]] = None, replay: str = "auto"):
        self.t, self.g = target_dump, golden_dump
        self.policy, self.shape_flag, self.replay = policy, shape_flag, replay
        self.tick = tick or (lambda n: None)
        self.rows: list[TensorRow] = []
        self.ops: list[OpScore] = []
        # A saved tensor is referenced by every record that saw it (an op's output is the next
        # op's input and its module's output): measure each pair of saved tensors once.
        self._measured: dict[tuple, Measurement] = {}

    def run(self) -> CompareResult:
        t_records = list(self.t.records())
        g_records = list(self.g.records())
        for dump, recs in ((self.t, t_records), (self.g, g_records)):
            if not recs:
                raise DumpError(f"{dump.path}: the dump holds no op records; was the model run "
                                f"between start() and stop()?")
        pairs = align(t_records, g_records, shape_flag=self.shape_flag)
        paired = sum(1 for ti, gi in pairs if ti is not None and gi is not None)
        if paired < MIN_PAIRED_FRACTION * max(len(t_records), len(g_records)):
            raise DumpError(f"{self.t.path} and {self.g.path} look like dumps of different models: "
                            f"only {paired} of {len(t_records)} target and {len(g_records)} golden "
                            f"ops line up; compare dumps of the same model and step")
        for position, (ti, gi) in enumerate(pairs):
            t_rec = t_records[ti] if ti is not None else None
            g_rec = g_records[gi] if gi is not None else None
            self._record(position, t_rec, g_rec)
            self.tick(1)
        replayer = self._replayer(t_records)
        divergence = analyse(self.ops, self.rows, self.policy, replay=replayer,
                             replay_all=self.replay == "all")
        if divergence is not None:
            divergence = replace(divergence, step=self.t.step, rank=self.t.rank)
        notes = []
        if replayer is not None and replayer.done:
            log.info("opdiff: %s", replayer.summary())
            notes.append(replayer.summary())
        limits = statistics_limits(self.rows, self.policy, replayed=replayer is not None)
        if limits:
            notes.append(limits)
        return CompareResult(
            target=str(self.t.path), golden=str(self.g.path), rows=self.rows,
            first_divergence=divergence, counts=count(self.rows),
            environment_diff=environment_diff(self.t.meta, self.g.meta),
            step=self.t.step, rank=self.t.rank, notes=notes)

    def _replayer(self, t_records: list):
        """Replay needs the target's own tensors, as only opdiff tensor dumps hold them
        (statistics dumps, msprobe and ONNX compares keep the comparison alone)."""
        if self.replay == "off" or getattr(self.t, "format", None) != "opdiff":
            return None
        if not any(r.get("kind", "api") in ("api", "aten") for r in t_records):
            return None
        if not getattr(self.t, "has_tensors", False):
            return None
        from ..replay import Replayer

        return Replayer(self.t, t_records, self.policy)

    # -- one op call --------------------------------------------------------------------------
    def _record(self, position: int, t_rec: Optional[dict], g_rec: Optional[dict]) -> None:
        rec = t_rec or g_rec
        name = rec["name"]
        t_tensors = {n[len(t_rec["name"]):]: (n, role, d) for n, role, d in iter_tensors(t_rec)} \
            if t_rec else {}
        g_tensors = {n[len(g_rec["name"]):]: (n, role, d) for n, role, d in iter_tensors(g_rec)} \
            if g_rec else {}
        stack = _location(self.t, t_rec) if t_rec else _location(self.g, g_rec)
        base = dict(op_name=name, phase=rec.get("phase", "forward"), kind=rec.get("kind", "api"),
                    index=position, module=rec.get("module"), stack=stack)
        op = None
        # Target-only ops get an OpScore too, with no measured tensors: the comparison cannot
        # judge them, replay can (a cast that only the bf16 run makes, say).
        if t_rec is not None:
            op = OpScore(name=name, op=rec.get("op", ""), phase=base["phase"], kind=base["kind"],
                         module=rec.get("module"), forward=rec.get("forward"), seq=position,
                         location=stack[0] if stack else None, paired=g_rec is not None)
            if g_rec is not None:
                op.arg_diffs, op.const_diffs = differing_numbers(t_rec, g_rec)
            self.ops.append(op)
        for suffix in list(t_tensors) + [s for s in g_tensors if s not in t_tensors]:
            t_item, g_item = t_tensors.get(suffix), g_tensors.get(suffix)
            if t_item is None or g_item is None:
                self.rows.append(self._unmatched(base, t_item, g_item,
                                                 paired_op=t_rec is not None and g_rec is not None))
                continue
            row, m = self._tensor_row(base, t_item, g_item)
            row_index = len(self.rows)
            self.rows.append(row)
            if m is None:
                continue
            role = t_item[1]
            is_output = role == "output" or (role == "parameters" and base["kind"] == "param_grad")
            entry = (row_index, m, row.target_dtype, row.golden_dtype)
            (op.outputs if is_output else op.inputs).append(entry)

    def _unmatched(self, base: dict, t_item, g_item, paired_op: bool) -> TensorRow:
        item = t_item or g_item
        desc = item[2]
        side = "target" if t_item else "golden"
        reason = (f"only the {side} op has this tensor" if paired_op
                  else f"op found only in the {side} dump")
        return TensorRow(
            target_name=t_item[0] if t_item else None, golden_name=g_item[0] if g_item else None,
            role=item[1], result=UNMATCHED, accuracy_reached="", reason=reason,
            target_dtype=t_item[2].get("dtype") if t_item else None,
            golden_dtype=g_item[2].get("dtype") if g_item else None,
            target_shape=tuple(t_item[2].get("shape") or ()) if t_item else None,
            golden_shape=tuple(g_item[2].get("shape") or ()) if g_item else None,
            target_stats=decoded_stats(desc) if t_item else {},
            golden_stats=decoded_stats(desc) if g_item else {}, **base)

    def _tensor_row(self, base: dict, t_item, g_item) -> tuple[TensorRow, Optional[Measurement]]:
        (t_name, role, td), (g_name, _, gd) = t_item, g_item
        t_shape, g_shape = tuple(td.get("shape") or ()), tuple(gd.get("shape") or ())
        common = dict(target_name=t_name, golden_name=g_name, role=role,
                      target_dtype=td.get("dtype"), golden_dtype=gd.get("dtype"),
                      target_shape=t_shape, golden_shape=g_shape,
                      target_stats=decoded_stats(td), golden_stats=decoded_stats(gd), **base)
        if t_shape != g_shape:
            return TensorRow(result=ERROR, accuracy_reached="No",
                             reason=f"shapes differ: {list(t_shape)} vs {list(g_shape)}",
                             **common), None
        for why, reason in _UNREAD.items():
            if td.get(why) or gd.get(why):   # values that mean nothing (see Describer.unread)
                return TensorRow(result=PASS, accuracy_reached="", reason=reason, **common), None
        pair = (td.get("key"), gd.get("key"))
        m = self._measured.get(pair)
        if m is not None:
            m = replace(m, metrics=dict(m.metrics))
        else:
            tt = _load(self.t, td)
            if tt is not None:
                gt = _load(self.g, gd)
                if gt is not None:
                    if tuple(tt.shape) != tuple(gt.shape):
                        return TensorRow(result=ERROR, accuracy_reached="No",
                                         reason=f"saved shapes differ: {list(tt.shape)} vs "
                                                f"{list(gt.shape)}", **common), None
                    m = measure(tt, gt)
                    if all(pair):
                        self._measured[pair] = m
                del tt, gt
        if m is None:
            if common["target_stats"] and common["golden_stats"]:
                m = stats_measure(common["target_stats"], common["golden_stats"], _numel(t_shape))
            else:
                return TensorRow(result=WARNING, accuracy_reached="",
                                 reason="neither tensor nor statistics saved on both sides",
                                 **common), None
        verdict = self.policy.judge(m, td.get("dtype"), gd.get("dtype"))
        reason = verdict.reason
        if m.message and m.message not in reason:
            reason = f"{reason}; {m.message}" if reason else m.message
        row = TensorRow(metrics=m.metrics, result=verdict.result,
                        accuracy_reached=verdict.accuracy_reached, reason=reason, mode=m.mode,
                        error=m.error, scale_error=m.scale_error, **common)
        return row, m


def compare_pair(target_dump, golden_dump, *, policy: Policy | None = None,
                 shape_flag: bool = False, tick: Optional[Callable[[int], None]] = None,
                 replay: str = "auto") -> CompareResult:
    """Compare two opened Dump-like objects (one step/rank each) and return the result.

    policy: a `opdiff.compare.verdicts.Policy` (default thresholds when None).
    shape_flag: pair ops only when every tensor shape matches (seed 003's `shape_flag`).
    tick: called with the number of op calls done, for progress bars.
    replay: "auto", "all" or "off" (see `compare`).
    """
    _check_replay(replay)
    with one_thread():
        return _PairCompare(target_dump, golden_dump, policy or Policy(), shape_flag, tick,
                            replay).run()


REPLAY_MODES = ("auto", "all", "off")


def _check_replay(replay) -> None:
    if replay not in REPLAY_MODES:
        raise OpdiffError(f"replay must be 'auto', 'all' or 'off', not {replay!r}")


@contextmanager
def one_thread():
    """Run torch single-threaded inside, restoring the caller's setting after.

    The metrics work on cache-sized chunks; splitting each small op across threads costs a
    barrier per op, and on a busy machine every barrier waits for a scheduler slice (measured
    here: 16 ms per op with 2 threads under load, against 0.1 ms single-threaded). Parallelism
    comes from comparing step/rank pairs in separate processes instead.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- whole dumps: step/rank pairing, processes, merging ------------------------------------------

def _key(d) -> tuple:
    return (d.step if d.step is not None else -1, d.rank if d.rank is not None else -1)


def pair_dumps(targets: list, goldens: list) -> tuple[list, list]:
    """[(target, golden)] by (step, rank), and notes about the ones without a partner."""
    if len(targets) == 1 and len(goldens) == 1:
        return [(targets[0], goldens[0])], []
    g_by_key = {_key(d): d for d in goldens}
    pairs, notes = [], []
    for t in targets:
        g = g_by_key.pop(_key(t), None)
        if g is None:
            notes.append(f"target step {t.step} rank {t.rank} has no golden counterpart; skipped")
        else:
            pairs.append((t, g))
    for g in g_by_key.values():
        notes.append(f"golden step {g.step} rank {g.rank} has no target counterpart; skipped")
    if not pairs:
        raise DumpError("no step/rank of the target dump has a counterpart in the golden dump; "
                        "point both paths at dumps of the same steps and ranks")
    return pairs, notes


def _count_records(dump) -> int:
    try:
        with open(os.path.join(dump.path, "records.jsonl"), "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def _worker(target_path: str, golden_path: str, thresholds: Thresholds, shape_flag: bool,
            replay: str = "auto"):
    import torch

    torch.set_num_threads(1)  # the processes already use every core
    from ..store.adapters import discover

    t, g = discover(target_path)[0], discover(golden_path)[0]
    return compare_pair(t, g, policy=Policy(thresholds), shape_flag=shape_flag, replay=replay)


def _merge(target: str, golden: str, results: list[CompareResult], notes: list) -> CompareResult:
    if len(results) == 1 and not notes:
        return results[0]
    rows = []
    for r in results:
        rows += [replace(row, step=r.step, rank=r.rank) for row in r.rows]
    divergent = [r for r in results if r.first_divergence is not None]
    first = None
    if divergent:
        # No clock is shared between ranks: earliest step first, then earliest op, then rank.
        best = min(divergent, key=lambda r: (r.step if r.step is not None else -1,
                                             _first_index(r), r.rank if r.rank is not None else -1))
        first = best.first_divergence
    env = results[0].environment_diff if results else []
    return CompareResult(
        target=target, golden=golden, rows=rows, first_divergence=first, counts=count(rows),
        environment_diff=env, pairs=[_pair_summary(r) for r in results],
        notes=list(notes) + _pair_notes(results))


def _pair_notes(results: list[CompareResult]) -> list[str]:
    """Each pair's notes, prefixed with where they hold; a note every pair has is said once."""
    where: dict = {}
    for r in results:
        for n in r.notes:
            where.setdefault(n, []).append(f"step {r.step} rank {r.rank}")
    return [n if len(places) == len(results) > 1 else f"{', '.join(places)}: {n}"
            for n, places in where.items()]


def _first_index(r: CompareResult) -> int:
    for row in r.rows:
        if row.op_name == r.first_divergence.name:
            return row.index
    return 0


def _pair_summary(r: CompareResult) -> dict:
    fd = r.first_divergence
    return {"step": r.step, "rank": r.rank, "target": r.target, "golden": r.golden,
            "counts": dict(r.counts), "first_divergence": fd.name if fd else None}


def compare(target, golden, output_path=None, *, thresholds=None, shape_flag: bool = False,
            fail_on: str | None = None, progress: bool | None = None,
            replay: str = "auto") -> CompareResult:
    """Compare the target dump (the run under suspicion) with the golden (trusted) dump.

    target, golden: a step/rank directory or a dump root of any format opdiff reads; with roots
        holding several steps/ranks every (step, rank) pair is compared, ranks in parallel.
    output_path: a directory; when given, writes compare_result_{timestamp}.csv, summary.json
        and report.html there and lists them in `result.files`.
    thresholds: None, a dict, a JSON file path or a `Thresholds` (see `opdiff.compare.verdicts`).
    shape_flag: pair ops only when their tensor shapes are equal.
    fail_on: None, "divergence" (a first divergence was found), "error" (any error row) or
        "warning" (any warning or error row): sets `result.failed` when it holds.
    progress: show a progress bar on stderr: None = when stderr is a terminal and the compare
        takes more than a second or so; True / False to force.
    replay: how much of the target to re-run in float64 on its own saved tensors to measure
        each op's own error (`opdiff.replay`; opdiff tensor dumps only): "auto" (default) the
        ops the comparison suspects and, when that is a backward op or nothing, the backward
        ops before it; "all" every op; "off" none (the comparison with golden alone).

    Raises `DumpError` (an `OpdiffError`) for missing, empty or corrupt dumps and for dumps of
    different models.
    """
    from ..store.adapters import discover

    if fail_on not in (None, "divergence", "error", "warning"):
        raise OpdiffError(f"fail_on must be None, 'divergence', 'error' or 'warning', not {fail_on!r}")
    _check_replay(replay)
    policy = Policy(thresholds)
    targets, goldens = discover(target), discover(golden)
    pairs, notes = pair_dumps(targets, goldens)
    total = sum(_count_records(t) for t, _ in pairs)
    with _Progress(total, progress) as bar:
        if len(pairs) == 1:
            t, g = pairs[0]
            results = [compare_pair(t, g, policy=policy, shape_flag=shape_flag, tick=bar.advance,
                                    replay=replay)]
        else:
            results = _run_parallel(pairs, policy, shape_flag, bar, replay)
    result = _merge(str(target), str(golden), results, notes)
    for note in notes:
        log.warning("opdiff: %s", note)
    result.verdict = verdict_line(result)
    result.failed = _failed(result, fail_on)
    if output_path is not None:
        from ..report import write_outputs

        result.files = write_outputs(result, output_path)
    return result


def _run_parallel(pairs, policy: Policy, shape_flag: bool, bar, replay: str = "auto"
                  ) -> list[CompareResult]:
    import multiprocessing

    workers = max(1, min(len(pairs), os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")  # fork after torch starts threads can deadlock
    results: list = [None] * len(pairs)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(_worker, str(t.path), str(g.path), policy.thresholds, shape_flag,
                               replay): i
                   for i, (t, g) in enumerate(pairs)}
        for fut in futures:
            i = futures[fut]
            results[i] = fut.result()
            bar.advance(_count_records(pairs[i][0]))
    return results


def _failed(result: CompareResult, fail_on: str | None) -> bool:
    if fail_on == "divergence":
        return result.first_divergence is not None
    if fail_on == "error":
        return result.counts.get(ERROR, 0) > 0
    if fail_on == "warning":
        return result.counts.get(ERROR, 0) + result.counts.get(WARNING, 0) > 0
    return False


def verdict_line(result: CompareResult) -> str:
    """One sentence on what the compare found."""
    fd = result.first_divergence
    if fd is None:
        # Statistics cannot show small errors: say so rather than claim the run is clean.
        caveat = (" — as far as statistics can tell (see the note on their limits)"
                  if any(r.mode == "statistics" for r in result.rows) else "")
        if result.counts.get(ERROR, 0) or result.counts.get(WARNING, 0):
            return ("no op is to blame: every difference is explained by the op's inputs and the "
                    "precision of its dtype (error grows gradually)" + caveat)
        return "no divergence: every compared tensor agrees with golden" + caveat
    where = ""
    if fd.location is not None:
        where = f" — {os.path.basename(fd.location.file)}:{fd.location.line}"
        if fd.location.code:
            where += f" `{fd.location.code.strip()}`"
    scope = ""
    if fd.step is not None or fd.rank is not None:
        scope = f" (step {fd.step}, rank {fd.rank})"
    return f"{fd.name}{scope}: {fd.reason}{where}"


class _Progress:
    """A rich progress bar on stderr that appears only when the compare is slow enough to need one."""

    DELAY_S = 1.5

    def __init__(self, total: int, mode: bool | None):
        self.total, self.mode = total, mode
        self.done = 0
        self.start = time.monotonic()
        self.bar = None
        self.task = None

    def __enter__(self):
        if self.mode is True:
            self._open()
        return self

    def _open(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                            MofNCompleteColumn(), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=True)
        self.bar.start()
        self.task = self.bar.add_task("comparing ops", total=self.total or None,
                                      completed=self.done)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.bar is None:
            if (self.mode is None and sys.stderr.isatty()
                    and time.monotonic() - self.start > self.DELAY_S):
                self._open()
            return
        self.bar.update(self.task, completed=self.done)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


__all__ = ["compare", "compare_pair", "pair_dumps", "verdict_line", "MIN_PAIRED_FRACTION"]
