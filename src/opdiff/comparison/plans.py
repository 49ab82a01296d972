"""Which plan compares two recordings, and how: one ordered table.

    from opdiff.comparison.plans import PLANS, plan_for, rewrites
    plan = plan_for(Recording.read(...), Recording.read(...))    # a Plan; plan.note: inconclusive?

Each row of `PLANS` is a predicate over (target `Recording`, golden `Recording`), the level it
acts at, and a plan. Rows are tried in order, as `CompilerBisector` walks its backends:

- SOURCES: given each side's dumps of one step, merge or split them before step/rank pairs are
  formed (`arrange`, called by `compare()` before `runs.pair_dumps`); every row that holds
  applies, in order.
- RECORDS: rewrite both sides' records of one pair before alignment (`rewrites`); every row that
  holds applies, in order, and the Recordings are read again from what it wrote.
- PAIRS: the first row that holds decides how the two runs pair, which units are judged and what
  blame may not name (`plan_for`). A row with `why` compares only what pairs by name (leaves,
  parameter gradients, module calls) and says "inconclusive: <why>" (`Plan.note`).

Adding a plan is one row here and its package (ARCHITECTURE.md, "the everyday changes").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence, Union, cast

from . import compiled, compiled_backward, compiled_inputs, compiled_modules, compiled_regions, \
    compiled_spans
from .facts import PairFacts
from .graph import RunGraph
from .recording import Recording
from .region_onesided import one_sided
from .regions import Region
from ..store.schema import Record
from .result import CompareResult, Divergence, Note, TensorRow
from .verdicts import Policy
from .lowprecision import LowPrecision

if TYPE_CHECKING:
    from ..store.source import DumpSource
    from .options import CompareOptions
    from .tokens.where import TokenErrors

Pair = tuple[Optional[int], Optional[int]]
SOURCES, RECORDS, PAIRS = "sources", "records", "pairs"


class SourcesPlan(Protocol):
    """SOURCES level: the dumps of one step on each side, laid out again (several ranks merged
    into one logical DumpSource, say) before step/rank pairs are formed. options: the compare's
    `CompareOptions` (its layout files), or None."""
    name: str

    def arrange(self, targets: list[DumpSource], goldens: list[DumpSource],
                options: Optional[CompareOptions] = None
                ) -> tuple[list[DumpSource], list[DumpSource], list[Note]]: ...

    def made(self, source: DumpSource) -> bool:
        """`source` is one this plan made (compared in this process: no path reopens it)."""

    def judged(self, result: CompareResult, target: DumpSource, golden: DumpSource
               ) -> CompareResult:
        """A pair of sources it made, once judged: what the plan adds (a culprit's rank)."""


@dataclass
class Rewritten:
    """What a RECORDS plan made of a pair: both sides' records, its notes, the dumps that serve
    the rewritten records' tensors (None: the same dumps), and what it says once the pair is
    judged (where the culprit differs, in its own terms)."""
    target: list[Record]
    golden: list[Record]
    notes: list[Note] = field(default_factory=list)
    sources: Optional[tuple[DumpSource, DumpSource]] = None
    after: Optional[Callable[[Optional[Divergence], list[TensorRow]], list[Note]]] = None
    measured: Optional[Callable[[list[TensorRow]], Optional[TokenErrors]]] = None   # error per token


class RecordsPlan(Protocol):
    """RECORDS level: both sides' records of one pair rewritten before alignment (padded
    batches sliced to the same tokens, say, or compiled code's module calls made); None: this
    pair needs nothing of the plan. options: the compare's `CompareOptions`."""
    name: str

    def rewrite(self, target: list[Record], golden: list[Record],
                sources: tuple[DumpSource, DumpSource], options: Optional[CompareOptions] = None
                ) -> Optional[Rewritten]: ...


class Plan:
    """PAIRS level: two runs that execute the same ops (eager against eager, foreign formats):
    aligned op by op, the ops only one run executes judged as regions through their boundary.
    Subclasses change a step; `note` set: only what pairs by name is compared."""
    name = "same ops"
    compiled = False        # (the region notes speak of compiled code: regions.unjudged_note)

    def __init__(self, note: Optional[str] = None) -> None:
        self.note = note

    def shape_flag(self, asked: bool) -> bool:
        """Pair ops only where their shapes agree."""
        return asked

    def pair(self, pairs: list[Pair], target: list[Record], golden: list[Record],
             graphs: Optional[tuple[RunGraph, RunGraph]] = None) -> list[Pair]:
        """The alignment's pairs, checked and completed (`graphs`: the two lists', `graph.py`)."""
        return pairs

    def pairable(self, target: list[Record], golden: list[Record]) -> Optional[int]:
        """How many records could pair at most (below `pair.MIN_PAIRED_FRACTION` of it paired:
        dumps of different models); None: not checked."""
        return None if self.note else max(len(target), len(golden))

    def regions(self, regions: list[Region], pairs: list[Pair], target: list[Record],
                golden: list[Record], t: Recording) -> list[Region]:
        """The regions found, with those only one side's ops make (`region_onesided`)."""
        return regions + one_sided(regions, pairs, target, golden, t.dataflow)

    def facts(self, target: list[Record], t: Recording) -> PairFacts:
        """What blame may not name, decided from the records (`facts.PairFacts`)."""
        return PairFacts(t.step, t.rank)

    def annotate(self, divergence: Divergence, target: list[Record], golden: list[Record],
                 dumps: tuple[tuple[DumpSource, list[Record]], ...]) -> Divergence:
        """The culprit with what the plan knows of where it ran."""
        return divergence

    def unexplained(self, rows: list[TensorRow], target: list[Record], held: dict[str, str],
                    policy: Policy) -> Optional[str]:
        """"inconclusive: ..." where nothing was named and tensors still differ; else None."""
        return None


class CompiledPlan(Plan):
    """One side ran torch.compile: pairs only where shapes and dataflow agree, backward ops
    through their forward ops, leaves and gradients by name (`compiled.py`); Inductor's regions
    joined (`compiled_regions`); what the compiled backward made and late module calls never
    named (`compiled_backward`, `compiled_inputs`)."""
    name = "compiled"
    compiled = True

    def shape_flag(self, asked: bool) -> bool:
        return True

    def pair(self, pairs: list[Pair], target: list[Record], golden: list[Record],
             graphs: Optional[tuple[RunGraph, RunGraph]] = None) -> list[Pair]:
        if self.note:
            return compiled.restrict(pairs, target, golden)
        return compiled.linked(pairs, target, golden, graphs)

    def pairable(self, target: list[Record], golden: list[Record]) -> Optional[int]:
        return None if self.note else compiled.comparable_records(target, golden)

    def regions(self, regions: list[Region], pairs: list[Pair], target: list[Record],
                golden: list[Record], t: Recording) -> list[Region]:
        return compiled_regions.joined(regions, target)

    def facts(self, target: list[Record], t: Recording) -> PairFacts:
        return PairFacts.of(t.step, t.rank, compiled_backward.withheld(target),
                            compiled_inputs.exposed(target))

    def annotate(self, divergence: Divergence, target: list[Record], golden: list[Record],
                 dumps: tuple[tuple[DumpSource, list[Record]], ...]) -> Divergence:
        annotated = compiled.annotate(divergence, target, golden, dumps)
        return annotated if annotated is not None else divergence   # (never None for one)

    def unexplained(self, rows: list[TensorRow], target: list[Record], held: dict[str, str],
                    policy: Policy) -> Optional[str]:
        return None if self.note else compiled_backward.unexplained(rows, target, held, policy)


class ModuleCalls:
    """RECORDS level: a compiled target recorded at mix gets module calls at the boundaries
    its compiled calls close (`compiled_modules`), and spans of calls where a kernel straddles
    them (`compiled_spans`)."""
    name = "compiled module calls"

    def rewrite(self, target: list[Record], golden: list[Record],
                sources: tuple[DumpSource, DumpSource], options: Optional[CompareOptions] = None
                ) -> Optional[Rewritten]:
        graph = RunGraph(target)        # (the target's seq index, shared while the list is one)
        called = compiled_modules.module_calls(target, golden, graph)
        target, golden = compiled_spans.span_calls(called, golden,
                                                   graph if called is target else None)
        return Rewritten(target, golden)


class RankLayouts:
    """SOURCES level: a side laid out over more or fewer ranks than the other (tensor,
    pipeline or data parallel against one device or another layout) merged into the one run
    its ranks split (`comparison/layouts/`: shards joined, partial sums added, replicas checked,
    stages chained); the culprit's rank is named once the pair is judged."""
    name = "rank layouts"

    def arrange(self, targets: list[DumpSource], goldens: list[DumpSource],
                options: Optional[CompareOptions] = None
                ) -> tuple[list[DumpSource], list[DumpSource], list[Note]]:
        from . import layouts
        found = layouts.logical_pairs(targets, goldens, (getattr(options, "layout", None),
                                                         getattr(options, "golden_layout", None)))
        if found is None:                   # laid out alike: compared rank by rank
            return targets, goldens, []
        pairs, said = found
        notes = [n if isinstance(n, Note) else Note(n, Note.SHARDING) for n in said]
        if not pairs:                       # not merged: rank by rank, the notes say why
            if any(n.kind == Note.INCONCLUSIVE for n in notes):
                return [], [], notes        # (rank by rank would blame innocent ops)
            return layouts.unlaid(targets), layouts.unlaid(goldens), notes
        return [t for t, _ in pairs], [g for _, g in pairs], notes

    def made(self, source: DumpSource) -> bool:
        from . import layouts
        return layouts.is_logical(source)

    def judged(self, result: CompareResult, target: DumpSource, golden: DumpSource
               ) -> CompareResult:
        from . import layouts
        return layouts.judged(result, target, golden)


class TokenLayouts:
    """RECORDS level: two runs that compute the same token sequences in other layouts (one
    sequence alone against a row of a padded batch, a prefill and decode steps through a KV
    cache against one forward): both sides cut to the matched sequences' real tokens
    (`comparison/tokens/`), which finds from the recorded input ids whether they differ."""
    name = "token layouts"

    def rewrite(self, target: list[Record], golden: list[Record],
                sources: tuple[DumpSource, DumpSource], options: Optional[CompareOptions] = None
                ) -> Optional[Rewritten]:
        from .tokens import align_tokens
        aligned = align_tokens(sources[0], sources[1], target, golden,
                               options.token_ids if options is not None else None)
        if aligned is None:
            return None
        return Rewritten(aligned.target_records, aligned.golden_records,
                         list(aligned.notes),
                         (aligned.target, aligned.golden), aligned.where, aligned.errors)


Then = Union[SourcesPlan, RecordsPlan, type[Plan]]


@dataclass(frozen=True)
class Row:
    """One row of the table: at `level`, when `when(target, golden)` holds, `then`; with
    `why`, the plan compares only what pairs by name and says why (`Plan.note`)."""
    level: str
    when: Callable[[Recording, Recording], bool]
    then: Then
    why: Optional[Callable[[Recording, Recording], str]] = None


def _compiled(t: Recording, g: Recording) -> bool:
    return t.compiled or g.compiled


def _levels(t: Recording, g: Recording) -> set[Optional[str]]:
    return {t.level, g.level}


def _side(t: Recording, g: Recording) -> Recording:
    """The compiled side (the target where both are)."""
    return t if t.compiled else g


PLANS: tuple[Row, ...] = (
    # -- SOURCES: ranks laid out otherwise on each side merged into the one run they split
    Row(SOURCES, lambda t, g: True, RankLayouts()),
    # -- RECORDS: every row that holds rewrites the pair's records, in order
    # the same tokens in other batch rows, padding or decode steps (found from recorded ids)
    Row(RECORDS, lambda t, g: True, TokenLayouts()),
    Row(RECORDS, lambda t, g: _compiled(t, g) and not t.mapped, ModuleCalls()),
    # quantize ops (float8, float4) judged by their own format and scale (`opdiff.lowp`); not
    # with a mapping file (a rewrite's records replace the mapping's renamed view)
    Row(RECORDS, lambda t, g: not t.mapped, LowPrecision()),
    # -- PAIRS: the first row that holds decides
    Row(PAIRS, lambda t, g: not _compiled(t, g), Plan),
    # Inductor's own kernels not recorded (Triton, or capture without them): extern calls only
    Row(PAIRS, lambda t, g: bool(_side(t, g).extern) and not _side(t, g).kernels, CompiledPlan,
        why=lambda t, g: compiled.unrecorded_kernels(_side(t, g), t.compiled)),
    # aten ops against aten ops: paired op by op where dataflow agrees
    Row(PAIRS, lambda t, g: _levels(t, g) <= {"L2", None}, CompiledPlan),
    # compiled against compiled, recorded alike: op by op too
    Row(PAIRS, lambda t, g: t.compiled and g.compiled and t.level == g.level
        and t.kernels == g.kernels, CompiledPlan),
    Row(PAIRS, lambda t, g: t.compiled and g.compiled and t.level == g.level, CompiledPlan,
        why=lambda t, g: compiled.kernels_against_aten(t.level)),
    # mix: module calls of compiled code judged at their boundaries (`ModuleCalls` made them)
    Row(PAIRS, lambda t, g: t.module_calls > 0, CompiledPlan),
    Row(PAIRS, lambda t, g: _side(t, g).kernels and bool(_side(t, g).unplaced), CompiledPlan,
        why=lambda t, g: compiled.modules_unknown(_side(t, g), t.compiled)),
    Row(PAIRS, lambda t, g: True, CompiledPlan,
        why=lambda t, g: compiled.levels_differ(t.compiled, _levels(t, g))),
)


def plan_for(t: Recording, g: Recording, table: Optional[Sequence[Row]] = None) -> Plan:
    """The first PAIRS row of `table` (default `PLANS`) that holds for (target, golden), as a
    Plan."""
    for row in PLANS if table is None else table:
        if row.level == PAIRS and row.when(t, g):
            assert isinstance(row.then, type) and issubclass(row.then, Plan)
            return row.then(row.why(t, g) if row.why is not None else None)
    raise AssertionError("the plan table ends in a row that always holds")


def rewrites(t: Recording, g: Recording, table: Optional[Sequence[Row]] = None
             ) -> list[RecordsPlan]:
    """The RECORDS rows of `table` (default `PLANS`) that hold for (target, golden), in order."""
    return [cast(RecordsPlan, row.then) for row in (PLANS if table is None else table)
            if row.level == RECORDS and row.when(t, g)]


def arrange(targets: list[DumpSource], goldens: list[DumpSource],
            table: Optional[Sequence[Row]] = None, options: Optional[CompareOptions] = None
            ) -> tuple[list[DumpSource], list[DumpSource], list[Note]]:
    """Each side's dumps laid out by the SOURCES rows of `table` (default `PLANS`) that hold
    (read from the first dump's meta on each side); as they are when none does. options: the
    compare's `CompareOptions` (layout files), handed to each row."""
    notes: list[Note] = []
    rows = [row for row in (PLANS if table is None else table) if row.level == SOURCES]
    if not rows or not targets or not goldens:
        return targets, goldens, notes
    t, g = (Recording.read((), d.meta, format=d.format, step=d.step, rank=d.rank)
            for d in (targets[0], goldens[0]))
    for row in rows:
        if row.when(t, g):
            plan = cast(SourcesPlan, row.then)
            targets, goldens, said = plan.arrange(targets, goldens, options)
            notes += said
    return targets, goldens, notes


def _sources_plans() -> list[SourcesPlan]:
    return [cast(SourcesPlan, row.then) for row in PLANS if row.level == SOURCES]


def made_by_plan(source: DumpSource) -> bool:
    """`source` was made by a SOURCES plan (it is compared in this process)."""
    return any(plan.made(source) for plan in _sources_plans())


def judged(result: CompareResult, target: DumpSource, golden: DumpSource) -> CompareResult:
    """A judged pair with what each SOURCES plan that made one of its sides adds to it."""
    for plan in _sources_plans():
        if plan.made(target) or plan.made(golden):
            result = plan.judged(result, target, golden)
    return result


def scope_note(target: list[Record], golden: list[Record], t_meta: Optional[dict[str, object]],
               g_meta: Optional[dict[str, object]]) -> Optional[str]:
    """What the table says of two sides' records as they are: the chosen plan's
    "inconclusive: ..." note, or None when they pair op by op (or at module calls)."""
    return plan_for(Recording.read(target, t_meta), Recording.read(golden, g_meta)).note


__all__ = ["PLANS", "Row", "Plan", "CompiledPlan", "ModuleCalls", "SourcesPlan", "RecordsPlan",
           "SOURCES", "RECORDS", "PAIRS", "Rewritten", "TokenLayouts", "RankLayouts", "made_by_plan", "judged",
           "plan_for", "rewrites", "arrange", "scope_note"]
