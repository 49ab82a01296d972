"""One step/rank pair: two opened dumps in, one CompareResult out.

    from opdiff.comparison.pair import compare_pair
    from opdiff.store.adapters import discover
    result = compare_pair(discover("./dump/npu/step0/rank0")[0], discover("./dump/cpu/step0/rank0")[0])

Aligns the two op sequences (`align`), measures every paired tensor (`metrics`, one pair of
tensors in memory at a time), gives verdicts (`verdicts`) and finds the first divergence
(`blame`, in words by `reasons`), replaying target ops where the target holds its own tensors (`replay`).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, cast

from ..errors import DumpError
from ..store.records import decoded_stats, iter_tensors
from ..store.schema import Descriptor, Kind, Location, Record, locations_from_frames
from ..store.source import DumpSource
from ..environment import diff_meta
from . import crossformat, forced
from .align import align, classes_note, same_classes
from .options import REPLAY_MODES, CompareOptions, check_replay
from .verdicts import Policy
from .blame import OpScore, differing_numbers
from .facts import ForcedFacts, PairFacts
from .graph import RunGraph
from .judgement import judge_pair
from .metrics import Measurement, measure, stats_measure
from .reasons import not_comparable, placement_note, statistics_limits
from .region_boundaries import Boundaries
from .region_cover import covered_tensors
from .region_facts import facts_of
from .regions import (REGION, absorb, Region, RegionOps, RegionUnit, find_regions, members,
                      op_list, unjudged_note, unrecorded_note)
from .saved import load_saved, numel
from .plans import Plan, plan_for, rewrites
from .recording import Recording
from .result import (ERROR, PASS, UNMATCHED, WARNING, CompareResult, Divergence, Note, TensorRow,
                     count, noted)
from .scores import add_row, counts_as_output, op_score
from .shards import KeyPair

if TYPE_CHECKING:
    from .replay import Replayer

    # (tensor name, role, descriptor), as `iter_tensors` yields them
    _Item = tuple[str, str, Descriptor]

log = logging.getLogger("opdiff")

# Descriptor flags of tensors whose values mean nothing (capture's Describer.unread).
_UNREAD = {"overwritten": "overwritten by the op without being read: not compared",
           "uninitialized": "uninitialised memory (torch.empty): not compared"}

EMPTY = "empty tensor (no elements): nothing to compare"

# Below this fraction of paired ops, two dumps are taken to be of different models.
MIN_PAIRED_FRACTION = 0.3


def _location(dump: DumpSource, record: Record) -> tuple[Location, ...]:
    """The record's call site as Locations, innermost user frame first."""
    return locations_from_frames(dump.stack(record["stack"])
                                 if record["stack"] is not None else ())


def _whole(desc: Descriptor) -> bool:
    """Does the tensor hold all of its values: a plain tensor, or a DTensor whose local shard is
    the global tensor (replicated, or sharded over one device) and not a partial sum?"""
    placed = desc.get("placement")
    return not placed or bool(placed.get("whole"))


class _PairCompare:
    """Compares one target dump with one golden dump; see `compare_pair`."""

    def __init__(self, target_dump: DumpSource, golden_dump: DumpSource,
                 options: CompareOptions, tick: Optional[Callable[[int], None]] = None,
                 measured: Optional[dict[KeyPair, Measurement]] = None) -> None:
        self.t, self.g = target_dump, golden_dump
        self.options = options
        self.mapping = options.mapping
        self.policy, self.shape_flag, self.replay = options.policy, options.shape_flag, \
            options.replay
        self.replay_jobs = options.replay_jobs
        self.tick = tick or (lambda n: None)
        self.rows: list[TensorRow] = []
        self.ops: list[OpScore] = []
        # A saved tensor is referenced by every record that saw it (an op's output is the next
        # op's input and its module's output): measure each pair of saved tensors once.
        self._measured: dict[KeyPair, Measurement] = dict(measured or {})  # shards.py
        # what a region's boundary is measured by (region_boundaries.Boundaries)
        self._by_tensor: dict[str, Any] = {}       # target tensor name -> row entry
        self._modules: dict[str, Any] = {}         # paired module call -> (inputs, outputs)
        self._region_rows: dict[int, list[int]] = {}   # region number -> its rows
        self._covered: dict[int, dict[str, Region]] = {}    # region_cover.covered_tensors
        self._forced: dict[tuple[int, int], forced.ForcedPair] = {}    # the mapping's `ops:`
        self._not_judged: list[str] = []        # forced pairs not judged (forced.CarriedInputs)
        self._forced_facts: list[ForcedFacts] = []  # ... and those judged with inputs carried
        self.facts = PairFacts()                # what the plan decided (facts.py)

    def run(self) -> CompareResult:
        t_records, g_records, t_view, notes = self._comparable()
        t, g = self._recordings(t_records, g_records)
        said_after, measures = [], []
        for rewrite in rewrites(t, g):      # the plan table's RECORDS rows (plans.py)
            made = rewrite.rewrite(t_records, g_records, (self.t, self.g), self.options)
            if made is not None:
                t_records, g_records, t_view, notes = made.target, made.golden, made.target, \
                    notes + made.notes
                self.t, self.g = made.sources or (self.t, self.g)   # (serving its tensors)
                said_after += [made.after] if made.after is not None else []
                measures += [made.measured] if made.measured is not None else []
                t, g = self._recordings(t_records, g_records)
        plan = plan_for(t, g)               # its PAIRS rows: how the two runs pair
        self._graph, g_graph = RunGraph(t_records), RunGraph(g_records)   # (graph.py: once)
        # a module class renamed at the same path (align.py): paired as if spelled alike
        t_view, classes = same_classes(t_view, g_records)
        notes += noted(classes_note(classes), Note.PAIRING)
        pairs = plan.pair(align(t_view, g_records, shape_flag=plan.shape_flag(self.shape_flag),
                                forced=list(self._forced)), t_records, g_records, (self._graph, g_graph))
        self._check_paired(pairs, plan.pairable(t_records, g_records), t_records, g_records)
        graphs = (self._graph if t_view is t_records else RunGraph(t_view), g_graph)  # (a view: its own)
        regions = find_regions(pairs, t_view, g_records, graphs[0])
        absorb(regions, pairs, t_view, g_records, (t.dataflow, g.dataflow), graphs)
        regions = plan.regions(regions, pairs, t_view, g_records, t)
        # a module call's tensors that only one side has, made or used by a region's ops
        self._covered = covered_tensors(regions, pairs, t_view, g_records, graphs[0])
        if t_view is not t_records:     # renamed: module calls are measured by recorded names
            recorded = {v["name"]: t["name"] for v, t in zip(t_view, t_records) if v is not t}
            for found in regions:
                found.module = recorded.get(found.module or "", found.module)
        t_region, g_region = members(regions)
        fed = forced.fed_ops(pairs, t_view, g_records, tuple(self._forced.values()),  # one-sided,
                             (t.dataflow, g.dataflow), (t_region, g_region), graphs)  # feed a forced pair
        divergence, held, region_ops, replayer = self._judge(
            plan, t, pairs, t_records, g_records, (t_region, g_region), fed, regions)
        if divergence is not None:
            divergence = plan.annotate(replace(divergence, step=self.t.step, rank=self.t.rank),
                                       t_records, g_records,
                                       ((self.t, t_records), (self.g, g_records)))
        for after in said_after:            # (a rewrite's words on the culprit: its tokens)
            notes += after(divergence, self.rows)
        result = self._result(plan, divergence, held, regions, region_ops, replayer, t_records,
                              notes)
        result.token_errors = next(filter(None, (m(self.rows) for m in measures)), None)
        return result

    def _comparable(self) -> tuple[list[Record], list[Record],
                                   list[Record], list[Note]]:
        """Both sides' records as alignment sees them: cross-format names made comparable
        (`crossformat`), the mapping file's renames, drops and joins (`mapping.py`); with the
        target's view (renamed) and what was left unused."""
        t_records = list(self.t.records())
        g_records = list(self.g.records())
        for dump, recs in ((self.t, t_records), (self.g, g_records)):
            if not recs:
                raise DumpError(f"{dump.path}: the dump holds no op records; was the model run "
                                f"between start() and stop()?")
        t_records, g_records, format_note = crossformat.comparable(
            t_records, g_records, self.t.format, self.g.format)
        t_view, notes = t_records, noted(format_note, Note.PAIRING)
        if self.mapping is not None:
            bound = self.mapping.bind(t_records, g_records)
            t_records = [t_records[i] for i in bound.target_index]
            g_records = bound.golden                # (`concat:` parts joined: concat.py)
            self.g = bound.golden_source(self.g)
            t_view = bound.view
            notes = [Note(n, Note.PAIRING) for n in [*bound.unused, *bound.notes]]
            self._forced = {(f.target, f.golden): f for f in bound.forced}
        return t_records, g_records, t_view, notes

    def _recordings(self, t_records: list[Record], g_records: list[Record]
                    ) -> tuple[Recording, Recording]:
        """What each side is (recording.py), read from its meta and records."""
        return (Recording.of(self.t, t_records, mapped=self.mapping is not None),
                Recording.of(self.g, g_records))

    def _check_paired(self, pairs: list[tuple[Optional[int], Optional[int]]],
                      pairable: Optional[int], t_records: list[Record],
                      g_records: list[Record]) -> None:
        paired = sum(1 for ti, gi in pairs if ti is not None and gi is not None)
        if pairable is not None and paired < MIN_PAIRED_FRACTION * pairable:
            raise DumpError(f"{self.t.path} and {self.g.path} look like dumps of different models: "
                            f"only {paired} of {len(t_records)} target and {len(g_records)} golden "
                            f"ops line up; compare dumps of the same model and step")

    def _judge(self, plan: Plan, t: Recording, pairs: list[tuple[Optional[int], Optional[int]]],
               t_records: list[Record], g_records: list[Record],
               in_regions: tuple[dict[int, Region], dict[int, Region]],
               fed: dict[int, forced.ForcedPair], regions: list[Region]
               ) -> tuple[Optional[Divergence], dict[str, str], list[OpScore], Optional[Replayer]]:
        """Every pair measured into rows, the units judged (`blame.analyse`), replaying the
        target where it can."""
        t_region, g_region = in_regions
        replayer = self._replayer(t_records)
        self._carried = forced.CarriedInputs(t_records, t.dataflow, self._graph)
        try:
            if replayer is not None:    # replay on a second thread while this one measures
                replayer.prefetch([r["name"] for r in t_records])
            for position, (ti, gi) in enumerate(pairs):
                t_rec = t_records[ti] if ti is not None else None
                g_rec = g_records[gi] if gi is not None else None
                region = t_region.get(ti) if ti is not None else g_region.get(gi)  # type: ignore[arg-type]
                self._record(position, t_rec, g_rec, region, self._forced.get((ti, gi)))  # type: ignore[arg-type]
                self.tick(1)
            self.rows = [forced.covered(r, fed[r.index], self.mapping.path) if r.index in fed
                         and r.result == UNMATCHED and self.mapping else r for r in self.rows]
            region_ops = self._regions(regions, t_records, g_records, plan.compiled)
            self.facts = plan.facts(t_records, t).with_units(facts_of(region_ops, self.rows),
                                                             self._forced_facts)
            divergence, held = judge_pair(
                self.ops, self.rows, self.facts, self.policy, replay=replayer,
                replay_all=self.replay == "all", regions=(
                    region_ops, self._region_rows, {r.number: r.why for r in regions if r.why}))
        finally:
            if replayer is not None:
                replayer.close()
        return divergence, held, region_ops, replayer

    def _result(self, plan: Plan, divergence: Optional[Divergence], held: dict[str, str],
                regions: list[Region], region_ops: list[OpScore], replayer: Optional[Replayer],
                t_records: list[Record], pairing: list[Note]) -> CompareResult:
        """The pair's result: its rows, the culprit and what the compare could not tell."""
        scope = plan.note or (plan.unexplained(self.rows, t_records, held, self.policy)
                              if divergence is None else None)
        notes: list[str] = [*noted(scope, Note.INCONCLUSIVE), *pairing]
        # A region not judged where tensors differ: never "no op is to blame" (a compiled run
        # whose side is recorded unlike the other has said its own: scope)
        skipped = None if scope else unjudged_note(regions, region_ops, self.rows,
                                                       divergence is not None,
                                                       plan.compiled, self.policy, self.ops)
        notes = noted(skipped, Note.INCONCLUSIVE) + notes
        notes += noted(unrecorded_note(regions, region_ops, t_records, divergence is not None
                                       or bool(skipped)), Note.PAIRING)
        notes += noted(forced.unjudged_note(self._not_judged, divergence is None and any(
            r.result in (ERROR, WARNING) for r in self.rows)), Note.INCONCLUSIVE)
        if replayer is not None and (replayer.done or replayer.regions):
            log.info("opdiff: %s", replayer.summary())
            notes.append(Note(replayer.summary(), Note.REPLAY))
        notes += noted(statistics_limits(self.rows, self.policy, replayed=replayer is not None),
                       Note.THRESHOLDS)
        notes += noted(placement_note(self.rows), Note.SHARDING)
        return CompareResult(
            target=str(self.t.path), golden=str(self.g.path), rows=self.rows,
            first_divergence=divergence, counts=count(self.rows),
            environment_diff=diff_meta(self.t.meta, self.g.meta),
            step=self.t.step, rank=self.t.rank, notes=notes,
            facts=[self.facts] if self.facts else [])

    def _replayer(self, t_records: list[Record]) -> Optional[Replayer]:
        """Replay needs the target's own tensors (`DumpSource.holds_tensors`: statistics dumps
        and foreign dumps keep the comparison alone) and ops it can re-run."""
        if self.replay == "off" or not self.t.holds_tensors:
            return None
        if not any(r["kind"] in Kind.REPLAYABLE for r in t_records):
            return None
        from .replay import Replayer

        return Replayer(self.t, t_records, self.policy, jobs=self.replay_jobs)

    # -- one op call --------------------------------------------------------------------------
    def _record(self, position: int, t_rec: Optional[Record],
                g_rec: Optional[Record], region: Optional[Region] = None,
                pair: Optional[forced.ForcedPair] = None) -> None:
        rec = cast("Record", t_rec or g_rec)
        name = rec["name"]
        t_tensors = {n[len(t_rec["name"]):]: (n, role, d) for n, role, d in iter_tensors(t_rec)} \
            if t_rec else {}
        g_tensors = {n[len(g_rec["name"]):]: (n, role, d) for n, role, d in iter_tensors(g_rec)} \
            if g_rec else {}
        if pair is not None:        # the mapping's tensor list: those tensors, and only those
            t_tensors, g_tensors = pair.keyed(t_tensors, g_tensors)
        stack = _location(self.t, t_rec) if t_rec else _location(self.g, cast("Record", g_rec))
        # (the number arguments of two different ops a mapping pairs are not the same arguments)
        differ, limits = differing_numbers(t_rec, g_rec) if t_rec and g_rec and (
            pair is None or t_rec["op"] == g_rec["op"]) else ([], [])
        # (the rows carry what the blame rules read, so that `rejudge` can apply them again)
        base: dict[str, Any] = dict(
            op_name=name, phase=rec["phase"], kind=rec["kind"],
            index=position, module=rec["module"], stack=stack, forward=rec.get("forward"),
            differing_numbers=tuple(differ), dtype_limits=tuple(limits), leaf=rec.get("leaf"),
            leaf_tensor=rec.get("tensor"), reader=rec.get("reader"),
            leaf_strict=self.t.step in (None, 0),
            rng=(t_rec.get("rng"), g_rec.get("rng")) if t_rec is not None and g_rec is not None
            and (t_rec.get("rng") or g_rec.get("rng")) else ())
        if region is not None:      # judged as one with the other ops of its region
            for suffix in list(t_tensors) + [s for s in g_tensors if s not in t_tensors]:
                self._region_row(base, t_tensors.get(suffix), g_tensors.get(suffix), region)
            return
        op: Optional[OpScore] = None
        # Target-only ops get an OpScore too, with no measured tensors: the comparison cannot
        # judge them, replay can (a cast that only the bf16 run makes, say).
        if t_rec is not None:
            op = op_score(base, op=rec["op"], paired=g_rec is not None)
            self.ops.append(op)
            if base["kind"] == Kind.MODULE and g_rec is not None:
                self._modules[name] = (op.inputs, op.outputs)
        for suffix in list(t_tensors) + [s for s in g_tensors if s not in t_tensors]:
            t_item, g_item = t_tensors.get(suffix), g_tensors.get(suffix)
            covered = self._covered.get(position, {}).get(suffix)
            if covered is not None and (t_item is None or g_item is None):
                self._region_row(base, t_item, g_item, covered)
                continue
            if t_item is None or g_item is None:
                if g_item is not None and g_item[0] in forced.borrowed(self._forced.values()):
                    continue        # shown once: in the row of the forced pair comparing it
                self.rows.append(self._unmatched(base, t_item, g_item,
                                                 paired_op=t_rec is not None and g_rec is not None))
                continue
            row, m = self._tensor_row(base, t_item, g_item)
            leaf = t_item[2].get("leaf")
            if m is not None and leaf and not counts_as_output(row):
                # a parameter, buffer or input (see capture/leaves.py)
                row = replace(row, leaf_input=f"{leaf} {t_item[2].get('fqn')}")
            self.rows.append(row)
            if m is not None:
                self._by_tensor[t_item[0]] = add_row(cast(OpScore, op), len(self.rows) - 1, row, m)
        if pair is not None and op is not None:
            self._judge_forced(op, cast("Record", t_rec))

    def _judge_forced(self, op: OpScore, t_rec: Record) -> None:
        """A forced pair's inputs it did not measure, taken where they were made; else it is
        not judged on its own (forced.py)."""
        carried = self._carried.entries(t_rec, self._by_tensor)
        self._forced_facts += forced.judged(op, carried, self.rows)   # (what `rejudge` reads)
        if carried is None:
            self._not_judged.append(op.name)

    # -- regions (regions.py) -------------------------------------------------------------------
    def _region_row(self, base: dict[str, Any], t_item: Optional[_Item], g_item: Optional[_Item],
                    region: Region) -> None:
        """A tensor of a region's op (or one only one side's module call has, that a region
        makes or reads): covered by the region, never unmatched."""
        self._region_rows.setdefault(region.number, []).append(len(self.rows))
        self.rows.append(replace(
            self._unmatched(base, t_item, g_item, False), result=PASS, region=region.label(),
            reason=f"in {region.label()}: the runs execute different ops here; judged as one "
                   f"through its boundary tensors"))

    def _regions(self, regions: list[Region], t_records: list[Record],
                 g_records: list[Record], compiled: bool = False) -> list[OpScore]:
        """One OpScore per region whose boundary can be measured, added to the ops judged."""
        if not regions:
            return []
        bounds = Boundaries(t_records, bool((self.t.meta or {}).get("dataflow")), self._by_tensor,
                            self._modules, g_records, upstream=compiled, graph=self._graph)
        consumers = bounds.consumers(regions)
        out: list[OpScore] = []
        for region in regions:
            made = consumers.get(region.number, {})
            found = bounds.by_dataflow(region, made)
            region.boundary = "dataflow" if found is not None else ""
            if found is None:
                found = bounds.by_module(region)
                region.boundary = "module" if found is not None else ""
            if found is None:
                region.why = bounds.unproven(region)
                continue
            listed = RegionOps(op_list(t_records, region.target, self._first_location(self.t)),
                               op_list(g_records, region.golden, self._first_location(self.g)),
                               bounds.entering(region) if region.boundary == "dataflow" else {})
            # (golden's ops alone: no target line; the region lists golden's own)
            loc = _location(self.t, t_records[region.target[0]]) if region.target else None
            op = OpScore(name=region.name, op="Region", phase=region.phase, kind=REGION,
                         module=region.module, forward=None, seq=region.position,
                         location=loc[0] if loc else None, inputs=list(found[0]),
                         outputs=list(found[1]))
            op.region = RegionUnit(region, listed, made if region.boundary == "dataflow" else {})
            out.append(op)
        self.ops.extend(out)
        return out

    def _first_location(self, dump: DumpSource) -> Callable[[Record], Optional[Location]]:
        def locate(rec: Record) -> Optional[Location]:
            loc = _location(dump, rec)
            return loc[0] if loc else None
        return locate

    def _unmatched(self, base: dict[str, Any], t_item: Optional[_Item], g_item: Optional[_Item],
                   paired_op: bool) -> TensorRow:
        item = cast("_Item", t_item or g_item)
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

    def _tensor_row(self, base: dict[str, Any], t_item: _Item,
                    g_item: _Item) -> tuple[TensorRow, Optional[Measurement]]:
        (t_name, role, td), (g_name, _, gd) = t_item, g_item
        t_shape, g_shape = tuple(td.get("shape") or ()), tuple(gd.get("shape") or ())
        common: dict[str, Any] = dict(
            target_name=t_name, golden_name=g_name, role=role,
            target_dtype=td.get("dtype"), golden_dtype=gd.get("dtype"),
            target_shape=t_shape, golden_shape=g_shape,
            target_stats=decoded_stats(td), golden_stats=decoded_stats(gd), **base)
        tp, gp = td.get("placement"), gd.get("placement")
        if (tp and gp and tp != gp) or (bool(tp) != bool(gp) and not (_whole(td) and _whole(gd))):
            # DTensor shards of different parts (or a part against a whole tensor): the op is
            # not judged (blame.analyse)
            return TensorRow(result=WARNING, accuracy_reached="", reason=not_comparable(tp, gp),
                             **common), None
        if t_shape != g_shape:
            return TensorRow(result=ERROR, accuracy_reached="No",
                             reason=f"shapes differ: {list(t_shape)} vs {list(g_shape)}",
                             **common), None
        for why, reason in _UNREAD.items():
            if td.get(why) or gd.get(why):   # values that mean nothing (see Describer.unread)
                return TensorRow(result=PASS, accuracy_reached="", reason=reason, **common), None
        if numel(t_shape) == 0:             # capture saves neither statistics nor values of it
            return TensorRow(result=PASS, accuracy_reached="Yes", reason=EMPTY, **common), None
        t_key, g_key = td.get("key"), gd.get("key")
        unread: list[str] = []
        m = self._measured.get((t_key, g_key)) if t_key and g_key else None
        if m is not None:
            m = replace(m, metrics=dict(m.metrics))
        else:
            tt = load_saved(self.t, td, unread)
            if tt is not None:
                gt = load_saved(self.g, gd, unread)
                if gt is not None:
                    if tuple(tt.shape) != tuple(gt.shape):
                        return TensorRow(result=ERROR, accuracy_reached="No",
                                         reason=f"saved shapes differ: {list(tt.shape)} vs "
                                                f"{list(gt.shape)}", **common), None
                    m = measure(tt, gt)
                    if t_key and g_key:
                        self._measured[(t_key, g_key)] = m
                del tt, gt
        if m is None:
            if common["target_stats"] and common["golden_stats"]:
                m = stats_measure(common["target_stats"], common["golden_stats"], numel(t_shape))
            else:
                return TensorRow(result=WARNING, accuracy_reached="",
                                 reason="neither tensor nor statistics saved on both sides",
                                 **common), None
        verdict = self.policy.judge(m, td.get("dtype"), gd.get("dtype"))
        reason = verdict.reason
        if m.message and m.message not in reason:
            reason = f"{reason}; {m.message}" if reason else m.message
        if unread:
            reason = "; ".join([reason, *unread]) if reason else "; ".join(unread)
        row = TensorRow(metrics=m.metrics, result=verdict.result,
                        accuracy_reached=verdict.accuracy_reached, reason=reason, mode=m.mode,
                        error=m.error, scale_error=m.scale_error, **common)
        return row, m


def compare_pair(target_dump: DumpSource, golden_dump: DumpSource,
                 options: Optional[CompareOptions] = None, *,
                 tick: Optional[Callable[[int], None]] = None,
                 measured: Optional[dict[KeyPair, Measurement]] = None,
                 **changes: Any) -> CompareResult:
    """Compare two opened Dump-like objects (one step/rank each) and return the result.

    options: how to judge (`options.CompareOptions`; its defaults when None); `changes`: any of
        its fields given by name instead (`compare_pair(t, g, policy=MsitPolicy())`).
    tick: called with the number of op calls done, for progress bars.
    measured: tensor pairs measured already, by (target key, golden key) (`shards.py`).
    """
    if changes.get("policy", Policy) is None:      # (policy=None: the default thresholds)
        del changes["policy"]
    options = replace(options or CompareOptions(), **changes) if changes \
        else options or CompareOptions()
    with one_thread():
        return _PairCompare(target_dump, golden_dump, options, tick, measured).run()


@contextmanager
def one_thread() -> Iterator[None]:
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


__all__ = ["compare_pair", "one_thread", "check_replay", "REPLAY_MODES", "MIN_PAIRED_FRACTION"]
