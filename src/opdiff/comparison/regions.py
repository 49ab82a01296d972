"""Regions: where the two runs execute different ops, the ops between paired tensors, judged as one.

Golden runs eager attention (`matmul`, `softmax`, `matmul`), the target one
`scaled_dot_product_attention`; one side has a fused norm, the other five small ops. The
alignment (`align.py`) pairs what both sides run alike and leaves the rest unpaired. Here each
stretch of unpaired op calls between two paired ones (in the alignment's order, one phase) that
holds ops of both sides is a *region*:

- its **inputs** are the tensors its target ops read from outside it: outputs of paired ops
  (found through the dump's dataflow, `"producer": [seq, slot]` on input descriptors), and
  leaves (parameters, buffers, inputs) through their own records;
- its **outputs** are the tensors its target ops made that paired ops outside it read: measured
  where those ops read them (the consumer's input row pairs the target region's output with the
  golden region's);
- backward, the same through each backward record's forward call: the gradients its target ops
  receive from paired ops and hand back to them (`region_gradients.py`);
- without dataflow (dumps written before it, foreign dumps) or where it does not reach (a
  region fed by another region, a gradient shared with ops outside it), the boundary is the
  innermost module call that holds the region's target ops, when that call is paired on both
  sides: its inputs and parameters, and what the paired ops inside it made before the region,
  against its outputs (backward: with its forward call's inputs and outputs among the inputs,
  `region_boundaries.Boundaries.by_module`).

Against a compiled run (Inductor's kernels) a tensor one region makes and only another reads
(the residual stream between norm kernels) is judged from what it was made of, through the
regions judged before (`region_boundaries`, upstream; `Region.through`), and a region whose
results only a later region reads joins it (`compiled_regions.py`).

A stretch of ops only one side executes is a region too where the target's dataflow proves its
boundary (`region_onesided.py`, after `find_regions` and `absorb`), and is unmatched otherwise.

A region is scored like an op (`blame.judge`: inputs agree and outputs do not: local error),
and can be the first divergence (`Divergence.region`). Its ops are never blamed one by one nor
counted unmatched: their rows say the region covers them. A region whose boundary cannot be
measured is not judged (its rows say so), and a pair where tensors differ and nothing is blamed
then says "inconclusive: ..." (`unjudged_note`), never that every difference is inherited.

Parameters the region reads that have no golden partner (one fused `qkv_proj.weight` against
three `q_proj`/`k_proj`/`v_proj` weights) are left out of its inputs rather than leaving the
region unjudged; a region blamed says they were not compared (`Region.unpaired_leaves`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from typing_extensions import TypedDict

from ..numbers import human
from ..store.schema import Kind, Location, Phase, Record, RecordName, module_path
from . import region_cover as cover
from .compiled_modules import by_inductor
from .facts import region_label
from .graph import RunGraph
from .result import ERROR, PASS, WARNING, Origin, TensorRow
from .verdicts import Policy, run_precision

if TYPE_CHECKING:
    from .blame import OpScore

Pair = tuple[Optional[int], Optional[int]]

REGION = Origin.REGION      # OpScore.kind and Divergence.origin of a region
SHOWN_OPS = 6               # ops listed per side in a reason


@dataclass
class Region:
    """One region: the record indices of its ops on each side, in execution order."""
    number: int
    phase: str
    target: list[int]
    golden: list[int]
    module: Optional[str] = None        # the innermost module call holding its target ops
    position: int = 0                   # its first op's place in the alignment
    boundary: str = ""                  # "dataflow" | "module" | "" (not measured)
    place: str = ""                     # `where`, when known without the module call (rejudge)
    unpaired_leaves: list[str] = field(default_factory=list)   # its parameters without a partner
    why: str = ""                       # why it was not judged, when known (`region_boundaries`)
    # a backward region of golden's ops alone: the target's forward calls twin to theirs
    # (record indices), through which its boundary is found (`region_onesided.py`)
    twins: list[int] = field(default_factory=list)
    # other regions' ops that made tensors it reads that nothing compared: it is judged from
    # what they were made of (`region_boundaries`, upstream), and its verdict names them
    through: list[str] = field(default_factory=list)
    # a backward region of Inductor's compiled backward whose results recorded ops may read (not
    # proven otherwise by the dataflow): a backward op differing after it may come from it
    # (`unjudged_note`; set by `region_boundaries.Boundaries.consumers`)
    feeds_backward: bool = False

    @property
    def name(self) -> str:
        return f"Region.{self.number}.{self.phase}"

    @property
    def where(self) -> str:
        """`model.layers.0.self_attn` (the module path of its module call; "" at the root)."""
        if self.place:
            return self.place
        parsed = RecordName.parse(self.module) if self.module else None
        return module_path(parsed.op) if parsed is not None else ""

    def label(self) -> str:
        """What its rows carry as `TensorRow.region` ("region 2 in model.layers.0.self_attn")."""
        return region_label(self.number, self.where)


class SourceLine(TypedDict):
    """A source line as a region's verdict lists it."""
    file: str
    line: int
    code: str


class ListedOp(TypedDict):
    """One op of a region as its verdict lists it (`Divergence.region`'s `target_ops`)."""
    name: str
    op: str
    location: Optional[SourceLine]
    module: Optional[str]           # the module call it ran in


def source_line(loc: Optional[Location]) -> Optional[SourceLine]:
    return None if loc is None else {"file": loc.file, "line": loc.line, "code": loc.code}


@dataclass
class RegionOps:
    """What a region divergence lists: each side's ops, with their source lines, and how the
    region reads the tensors entering it (`region_boundaries.Boundaries.entering`; empty
    without dataflow)."""
    target_ops: list[ListedOp] = field(default_factory=list)
    golden_ops: list[ListedOp] = field(default_factory=list)
    readers: dict[str, tuple[str, str, str]] = field(default_factory=dict)


@dataclass
class RegionUnit:
    """A region judged as one op: what its score (`blame.OpScore.region`) holds besides its
    rows. `made`: an output row's tensor -> the tensor the region made (measured where a paired
    op reads it: that reader's input; by dataflow only)."""
    region: Region
    listed: RegionOps
    made: dict[str, str] = field(default_factory=dict)


def find_regions(pairs: list[Pair], target: list[Record], golden: list[Record],
                 graph: Optional[RunGraph] = None) -> list[Region]:
    """The regions of an alignment (see module docstring); [] when every op is paired.
    graph: the target's (`graph.RunGraph`), when the caller has it."""
    regions: list[Region] = []
    run_t: list[int] = []
    run_g: list[int] = []
    phase: Optional[str] = None
    start = 0

    def close() -> None:
        if run_t and run_g:
            regions.append(Region(len(regions), phase or Phase.FORWARD, list(run_t), list(run_g),
                                  position=start))
        run_t.clear()
        run_g.clear()

    for position, (ti, gi) in enumerate(pairs):
        rec = target[ti] if ti is not None else golden[gi]  # type: ignore[index]
        kind = rec["kind"]
        if ti is not None and gi is not None:
            if kind not in (Kind.LEAF, Kind.PARAM_GRAD):    # (a leaf read first inside: no end)
                close()
            continue
        if kind not in Kind.OPS:
            continue            # modules, leaves and parameter gradients are never in a region
        if rec["phase"] != phase or not (run_t or run_g):
            close()
            phase, start = rec["phase"], position
        (run_t.append(ti) if ti is not None else run_g.append(gi))  # type: ignore[arg-type]
    close()
    parents = (graph or RunGraph(target)).parents
    for region in regions:
        region.module = common_module([target[i]["module"] for i in region.target], parents)
    return regions


def absorb(regions: list[Region], pairs: list[Pair], target: list[Record], golden: list[Record],
           dataflow: tuple[bool, bool], graphs: Optional[tuple[RunGraph, RunGraph]] = None
           ) -> None:
    """Ops only one run executes whose results feed nothing but regions of that side (eager
    attention's mask, which SDPA's causal flag makes unneeded) join the first region they
    feed: they are part of its computation, not unmatched ops. So do forward ops whose results
    no op reads at all (the mask builder's unused batch and head indices), when an op of the
    same unbroken run of that side's unpaired ops joined a region: they belong to the same
    work, and a value nothing reads cannot carry a difference anywhere. Needs that side's
    dataflow; module records, which only pass tensors on, are not readers."""
    if not regions:
        return
    for side, records, flow in ((0, target, dataflow[0]), (1, golden, dataflow[1])):
        if not flow:
            continue
        region_of: dict[int, int] = {}
        for r in regions:
            for i in (r.target if side == 0 else r.golden):
                region_of[i] = r.number
        lone = sorted((i for i in (p[side] for p in pairs if p[1 - side] is None)
                       if i is not None and i not in region_of), reverse=True)
        lone_set = set(lone)
        readers = graphs[side].readers if graphs else cover.readers(records)
        dead: set[int] = set()
        for i in lone:          # latest first: an op feeding an absorbed op is absorbed after it
            rec = records[i]
            if rec["kind"] not in Kind.OPS or i not in lone_set:
                continue
            fed = [k for k in readers.get(i, ()) if k not in dead]
            if fed and all(k in region_of for k in fed):
                region_of[i] = min(region_of[k] for k in fed)
            elif not fed and rec["phase"] == Phase.FORWARD:
                dead.add(i)
        if dead:
            cover.join_runs(dead, region_of, pairs, side)
        for i, number in region_of.items():
            members_of = regions[number].target if side == 0 else regions[number].golden
            if i not in members_of:
                members_of.append(i)
        for r in regions:
            (r.target if side == 0 else r.golden).sort()


def common_module(modules: list[Optional[str]], parents: Mapping[str, Optional[str]]
                  ) -> Optional[str]:
    """The innermost module call that holds every one of `modules` (module call names)."""
    chains = []
    for m in dict.fromkeys(modules):
        chain: list[str] = []
        while m and m not in chain:
            chain.append(m)
            m = parents.get(m)
        chains.append(chain[::-1])
    if not chains or any(not c for c in chains):
        return None
    common: Optional[str] = None
    for names in zip(*chains):
        if len(set(names)) != 1:
            break
        common = names[0]
    return common


def members(regions: list[Region]) -> tuple[dict[int, Region], dict[int, Region]]:
    """(target record index -> region, golden record index -> region)."""
    t_of = {i: r for r in regions for i in r.target}
    g_of = {j: r for r in regions for j in r.golden}
    return t_of, g_of


def mark_region_rows(rows: list[TensorRow], region_ops: Sequence[OpScore],
                     region_rows: dict[int, list[int]],
                     unjudged: Optional[dict[int, str]] = None) -> None:
    """After the blame: a region's rows say its verdict (not judged when its boundary could not
    be measured, and why where `unjudged` (region number -> why) knows; cleared or not replayed
    by its chain replay), and a blamed region's worst boundary output row is an error. Without
    `unjudged` (rejudge) the rows of a region not judged are left as they are."""
    judged = {op.region.region.number: op for op in region_ops if op.region}
    for number, indices in region_rows.items():
        op = judged.get(number)
        for i in indices:
            row = rows[i]
            if op is None:
                if unjudged is None:
                    continue        # (rejudge: the compare's rows say why)
                why = unjudged.get(number) or "the tensors entering and leaving it are not paired"
                rows[i] = replace(row, result=WARNING, reason=(
                    f"in {row.region}: the runs execute different ops here, and {why}: not "
                    f"judged"))
            elif op.local:
                rows[i] = replace(row, reason=f"in {row.region}: local error in this region "
                                              f"(see the first divergence)")
            elif op.replay is not None:     # replayed as a chain (replay/chain.py), or why not
                cleared = ": its own error is its dtypes', any difference is inherited" \
                    if op.replay.replayed else ""
                rows[i] = replace(row, reason=f"{row.reason}; {op.replay.describe()}{cleared}")
        if op is not None and op.region is not None and op.local and op.worst_out is not None:
            worst, label = rows[op.worst_out], op.region.region.label()
            if worst.result != ERROR:
                rows[op.worst_out] = replace(worst, result=ERROR, accuracy_reached="No",
                                             reason=f"{worst.reason}; the output of "
                                                    f"{label}: local error")


def unjudged_note(regions: list[Region], region_ops: Sequence[OpScore], rows: list[TensorRow],
                  found: bool, compiled: bool = False,
                  policy: Optional[Policy] = None,
                  paired: Sequence[OpScore] = ()) -> Optional[str]:
    """"inconclusive: ..." when nothing was blamed, tensors differ, and a region could not be
    judged (its boundary not measured): the difference may start there, so opdiff does not
    say that every difference is inherited. In a compiled run (`compiled`) only a tensor beyond
    its tolerance, and beyond the run's precision (`policy.beyond_run_tolerance`), is evidence
    (fusion changes rounding everywhere), and a backward op's is not: the compiled backward's
    ops pair with eager's through their forward op, and one of several alike (a product's two
    `mul`s) may pair with the other's twin: such a row is evidence only after a region of
    Inductor's compiled backward not judged whose results recorded ops may read
    (`Region.feeds_backward`; a twin mispaired there makes the answer inconclusive, never a
    false claim of agreement). Nor, in a compiled run, is the output of a paired op `paired`
    whose every input agrees (an optimizer's step that turns gradients agreeing to 1e-7 into
    updates apart by 3e-5): its difference is made there, from inputs no region spoiled beyond
    rounding."""
    judged = {op.region.region.number for op in region_ops if op.region}
    skipped = [r for r in regions if r.number not in judged]
    run = run_precision(rows) if compiled else None
    made_here = {i for op in paired if compiled and not op.local and op.inputs and all(
        rows[k].result == PASS for k, _, _, _ in op.inputs) for i, _, _, _ in op.outputs}
    beyond = [row for k, row in enumerate(rows) if row.result in (ERROR, WARNING)
              and not row.region and k not in made_here
              and not (compiled and (row.accuracy_reached != "No" or (
                  policy is not None and not policy.beyond_run_tolerance(row, run))))]
    backward = [row.index for row in beyond
                if compiled and row.phase == Phase.BACKWARD and row.kind in Kind.OPS]
    differ = [row.index for row in beyond
              if not (compiled and row.phase == Phase.BACKWARD and row.kind in Kind.OPS)]
    if compiled:
        skipped = [r for r in skipped if r.position < min(differ, default=-1)
                   or (r.feeds_backward and r.position < min(backward, default=-1))]
        differ = differ or backward
    if found or not skipped or not differ:
        return None
    # (a region after the first difference cannot have made it: those before it, if any; in a
    # compiled run, whose alignment is in the target's order, none: a region after it is moot)
    skipped = skipped if compiled else ([r for r in skipped if r.position < min(differ)]
                                        or skipped)
    if not skipped:
        return None
    names = ", ".join(r.label() + (f" ({r.why})" if r.why else "")
                      for r in skipped[:SHOWN_OPS]) + (", ..." if len(skipped) > SHOWN_OPS else "")
    generic = ("the runs execute different ops there, and the tensors entering and leaving "
               f"{'it are' if len(skipped) == 1 else 'them are'} not paired")
    if all(r.why for r in skipped):
        generic = "the runs execute different ops there"
    return (f"inconclusive: tensors differ, and {names} could not be judged ({generic}): the "
            f"difference may start there; no op elsewhere is blamed")


def unrecorded_note(regions: list[Region], region_ops: Sequence[OpScore], target: list[Record],
                    found: bool) -> Optional[str]:
    """Where nothing was blamed: the regions of Inductor's compiled backward not judged whose
    results recorded ops do not read (`Region.feeds_backward` False: the last kernel, making
    the embedding's and the first norm's weight gradients, at L2, which records no parameter
    gradient). A difference they make shows in no tensor compared: said, not hidden."""
    if found:
        return None
    judged = {op.region.region.number for op in region_ops if op.region}
    left = [r for r in regions if r.number not in judged and r.phase == Phase.BACKWARD and
            not r.feeds_backward and r.target and any(by_inductor(target[i]) for i in r.target)]
    if not left:
        return None
    kernels = [f"`{target[i]['op']}`" for r in left for i in r.target
               if target[i]["kind"] == Kind.KERNEL]
    return (f"not judged: {', '.join(r.label() for r in left)} of the compiled backward "
            f"({', '.join(kernels[:SHOWN_OPS]) or 'its calls'}): its results are parameters' "
            f"gradients only, which this level does not record, so a difference it makes shows "
            f"in no tensor compared here; record the step at level mix as well, where "
            f"parameter gradients are compared")


def op_list(records: list[Record], indices: list[int],
            locate: Callable[[Record], Optional[Location]]) -> list[ListedOp]:
    """[{"name", "op", "location", "module"}] of a side's region ops (`locate(record)` ->
    Location|None; `module` the module call the op ran in)."""
    return [{"name": records[i]["name"], "op": records[i]["op"],
             "location": source_line(locate(records[i])), "module": records[i].get("module")}
            for i in indices]


def region_members(op: OpScore) -> Optional[list[str]]:
    """The target records a region's score (`blame.OpScore` of kind region) stands for, in
    execution order: what its chain replay re-runs (`replay.chain`); None for any other op and
    for a region without target ops (a one-sided region of the target's is replayed: its
    arithmetic checked; whether golden, which runs no op there, agrees is the boundary's to say,
    `computes_another_function`)."""
    if op.kind != REGION or op.region is None or not op.region.listed.target_ops:
        return None     # (a region of golden's ops alone: nothing of the target's to replay)
    return [o["name"] for o in op.region.listed.target_ops]


# How much a region whose ops compute golden's function may amplify its inputs' difference
# (an ill-conditioned one, a softmax of large logits, does by tens) before an output that
# differs by more says its ops compute something else (`computes_another_function`).
CONDITIONING = 100.0


def computes_another_function(op: OpScore, local: Any, rows: list[TensorRow], policy: Policy) -> str:
    """Why a region the boundary blamed stays blamed though its chain replay found the target's
    arithmetic right (`local`, a replay.chain.ChainError), or "".

    The replay re-runs the target's own ops: it tells whether they were computed right, not
    whether they compute what golden's do (`x * sigmoid(1.702 x)` against `gelu`). An output
    that differs from golden's by more than the target's own error, golden's rounding (the
    pair's tolerance) and CONDITIONING times its inputs' difference is not inherited."""
    if op.kind != REGION or not local.replayed or local.culprit:
        return ""
    for measured, error, t_dtype, g_dtype in _replayed_outputs(op, local, rows):
        bound = policy.tolerance_for(t_dtype, g_dtype) + CONDITIONING * op.error_in
        if measured.error - error > bound:
            return another_function_words(op, rows)
    return ""


def another_function_words(op: OpScore, rows: list[TensorRow]) -> str:
    """The clause a region blamed though its replay cleared its arithmetic says (above); ""
    for any other op."""
    replay = getattr(op, "replay", None)
    if op.kind != REGION or replay is None or not replay.replayed or replay.culprit:
        return ""
    found = _replayed_outputs(op, replay, rows)
    if not found:
        return ""
    measured, error, _, _ = max(found, key=lambda f: f[0].error - f[1])
    return (f"replayed in float64 from its own inputs, the target's ops give its output (own "
            f"error {human(error)}), yet it differs from golden's by {human(measured.error)} "
            f"while its inputs differ by {human(op.error_in)}: they compute something else than "
            f"golden's ops")


def _replayed_outputs(op: OpScore, replay: Any, rows: list[TensorRow]
                      ) -> list[tuple[Any, float, Optional[str], Optional[str]]]:
    own = {t.name: t.error for t in replay.tensors}
    out = []
    for row_index, measured, t_dtype, g_dtype in op.outputs:
        error = own.get(made_tensor(op, rows[row_index].target_name) or "")
        if error is not None:
            out.append((measured, error, t_dtype, g_dtype))
    return out


def made_tensor(op: OpScore, measured: Optional[str]) -> Optional[str]:
    """The tensor a region made that a boundary output row measures (measured where a paired
    op reads it: that reader's input name); `measured` itself for any other op."""
    made = op.region.made if op.kind == REGION and op.region is not None else {}
    return made.get(measured, measured) if measured else measured


__all__ = ["REGION", "Region", "RegionOps", "RegionUnit", "ListedOp", "SourceLine",
           "source_line", "find_regions", "members", "absorb", "mark_region_rows",
           "unjudged_note", "unrecorded_note", "common_module", "op_list", "region_members",
           "made_tensor", "computes_another_function", "another_function_words",
           "CONDITIONING"]
