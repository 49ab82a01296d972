"""Op-to-op lines of the mapping file: forced pairs, and how one is judged.

    ops:                      # target record[.tensor]: golden record[.tensor]
      Functional.scaled_dot_product_attention.0.forward.output.0: Torch.matmul.1.forward.output.0
      NPU.npu_rms_norm.0.forward: Functional.rms_norm.0.forward      # whole records

msprobe's `data_mapping.yaml` lines that name op calls (`NPU.npu_fusion_attention.4.forward.input.0:
NPU.npu_fusion_attention.4.forward.input.0`) are the same lines without the section.

A **forced pair** is one target record paired with one golden record, whatever their names or
shapes: the alignment pairs it before anything else (`align.align(forced=)`), and the ops between
it and other paired ops form regions as they would between any two paired ops. Lines that name
tensors give its **tensor list**: only those tensors are compared (target `input.0` against
golden `input.1`, say); its other tensors get no row. Lines that name whole records compare the
tensors both records hold under one name (`.input.0` with `.input.0`). Several lines of one pair
add up. Lines that name tensors may pair one target record with several golden records
(msprobe's data_mapping.yaml: SDPA's q against eager attention's first matmul's input, its output
against the last matmul's): alignment pairs it with the latest of them, and each tensor is
compared with the golden tensor its line names wherever that is (`ForcedPair.borrowed`), so it
is judged as one op against both (its golden side both ops). A golden record paired with two
target records, a target record paired with several by a line naming whole records, a tensor
paired twice, or two pairs in the other order on the two sides are errors naming the line
(`resolve`).

Judging it (`CarriedInputs`): blame asks whether an op's inputs agree while its outputs do not.
A forced pair whose lines compare only outputs (SDPA's output against the last matmul's) or whose
inputs could not be measured (other shapes) takes each input it did not measure from where the
target run made it: the measured output of the op that made it (the dump's dataflow) or the
record of the parameter, buffer or input. Where one cannot be found there, the op is not judged
on its own: its rows say so, nothing blames it, and when nothing else is blamed either the pair
is "inconclusive: ..." (`unjudged_note`); replay may still name it from its own inputs. Both are
kept as the pair's facts (`facts.ForcedFacts`), with which `rejudge` judges it again (`carry`).

Ops only one run executes whose results feed nothing but a forced pair's op (eager attention's
first matmul and softmax, where the file pairs SDPA's output with the last matmul's) are that
pair's computation: their rows say the pair covers them (`fed_ops`, `covered`), not unmatched; a golden tensor a
pair takes from another record (`borrowed`) is shown in the pair's row only.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Optional

from ..store.records import iter_tensors
from ..store.schema import Descriptor, Kind, Record, Role
from .facts import ForcedFacts
from .graph import RunGraph
from .region_cover import readers
from .result import PASS

if TYPE_CHECKING:
    from .blame import OpScore
    from .scores import Entry       # a row entry of an OpScore
    from .facts import PairFacts
    from .mapping import Mapping, Rule
    from .result import TensorRow

Item = tuple[str, str, Descriptor]   # (tensor name, role, descriptor), as `iter_tensors` yields them
_LEAVES = ("parameter", "buffer", "input")


@dataclass(frozen=True)
class ForcedPair:
    """One forced pair: `target`/`golden` indices in the records alignment sees (after ignored
    records are dropped and `concat:` parts joined), `tensors` the (target suffix, golden suffix)
    pairs compared (`.output.0`), `lines` the file's lines that made it."""
    target: int
    golden: int
    tensors: tuple[tuple[str, str], ...]
    lines: tuple[int, ...]
    names: tuple[str, str] = ("", "")       # the two record names ("G1 and G2" for several)
    # a target record paired with several golden ones (msprobe's data_mapping.yaml lets one NPU
    # op stand for two GPU ops): alignment pairs it with the latest (`golden`); the tensors the
    # lines take from the others, (target suffix, the golden tensor (name, role, descriptor)),
    # and those golden records' indices. Judged as one op: its inputs against the golden
    # tensors the lines name wherever they are, its outputs the same (a region, in effect).
    borrowed: tuple[tuple[str, Item], ...] = ()
    others: tuple[int, ...] = ()

    def said(self, path: str) -> str:
        """`Functional.x.0.forward against Torch.y.3.forward (pairs.yaml:2)`, as rows say it."""
        at = ", ".join(str(n) for n in self.lines)
        return f"{self.names[0]} against {self.names[1]} ({path}:{at})"

    def keyed(self, t_tensors: dict[str, Item], g_tensors: dict[str, Item]
              ) -> tuple[dict[str, Item], dict[str, Item]]:
        """The two records' tensors ({suffix: item}) as the pair compares them: one key per
        listed pair, the target's suffix naming both."""
        borrowed = dict(self.borrowed)
        order = [t for t in t_tensors if t in borrowed or any(t == s for s, _ in self.tensors)]
        golden = {t: g_tensors[g] for t, g in self.tensors}
        golden.update(borrowed)
        return {t: t_tensors[t] for t in order}, {t: golden[t] for t in order}


def _listed(names: list[str]) -> str:
    """"A", "A and B", "A, B and C"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _tensor(record: Record, suffix: str) -> tuple[str, str, Descriptor]:
    """(name, role, descriptor) of a record's tensor by its suffix (`.input.0`), as pair.py
    keys a record's tensors."""
    name = record["name"] + suffix
    return next(t for t in iter_tensors(record) if t[0] == name)


def _suffixes(record: Record) -> list[str]:
    cut = len(record["name"])
    return [name[cut:] for name, _, _ in iter_tensors(record)]


def resolve(mapping: "Mapping", rules: list["Rule"], target: list[Record], kept: list[Record],
            golden: list[Record], joined: list[Record]) -> tuple[ForcedPair, ...]:
    """The forced pairs of `rules` (kind "op") in one pair of dumps, by target order. target,
    golden: every record of each dump; kept, joined: what alignment sees of each (ignored
    records dropped, `concat:` parts joined). A line naming a record or tensor its dump does
    not hold is a `MappingError` naming the file and line."""
    from .mapping import MappingError

    t_at = {r["name"]: k for k, r in enumerate(kept)}
    g_at = {r["name"]: k for k, r in enumerate(joined)}
    sides = (("target", t_at, {r["name"] for r in target}, {r["name"] for r in golden}),
             ("golden", g_at, {r["name"] for r in golden}, {r["name"] for r in target}))
    partner: dict[tuple[str, int], tuple[int, int]] = {}     # (side, index) -> (other, line)
    listed: dict[tuple[int, int], dict[str, tuple[str, int]]] = {}
    whole: set[tuple[int, int]] = set()              # pairs a line names whole
    whole_t: set[int] = set()                         # ... their target records
    golden_of: dict[int, set[int]] = {}               # target record -> golden records it pairs
    taken: dict[tuple[int, str], tuple[str, int, int]] = {}  # (ti, t suffix) -> (g suffix, gi, line)
    lines: dict[tuple[int, int], list[int]] = {}
    for rule in rules:
        where = mapping.where(rule)
        found = []
        for (side, at, recorded, other), name in zip(sides, (rule.old, rule.new)):
            k = at.get(name)
            if k is None:
                why = ("an 'ignore:' line drops it" if name in recorded else
                       f"the {'golden' if side == 'target' else 'target'} dump holds it: the "
                       f"left name is the target's, the right one golden's" if name in other else
                       "check the spelling against the report's names")
                raise MappingError(f"{where}: {name!r} names no record of the {side} dump; {why}")
            found.append(k)
        ti, gi = found
        for side, mine, theirs in (("target", ti, gi), ("golden", gi, ti)):
            before = partner.setdefault((side, mine), (theirs, rule.line))
            # (a target record against several golden ones only through lines that name
            # tensors, which say which golden record holds each: `ForcedPair.borrowed`)
            if before[0] != theirs and (side == "golden" or not rule.parts or ti in whole_t):
                name = rule.old if side == "target" else rule.new
                raise MappingError(f"{where}: {name!r} is paired with another record on line "
                                   f"{before[1]} already; a record pairs with one record"
                                   + ("" if side == "golden" else " (with several only through "
                                      "lines that name tensors)"))
        lines.setdefault((ti, gi), []).append(rule.line)
        if not rule.parts:
            if partner[("target", ti)][0] != gi or any(
                    g != gi for g in golden_of.get(ti, ())):
                raise MappingError(f"{where}: {rule.old!r} is paired with several golden "
                                   f"records; a line naming whole records cannot say which "
                                   f"holds which tensor")
            whole.add((ti, gi))
            whole_t.add(ti)
            continue
        golden_of.setdefault(ti, set()).add(gi)
        for (suffix, records, k), name in zip(((rule.parts[0], kept, ti),
                                               (rule.parts[1], joined, gi)), (rule.old, rule.new)):
            held = _suffixes(records[k])
            if suffix not in held:
                raise MappingError(f"{where}: {name + suffix!r} names no tensor of {name!r} "
                                   f"(it holds {', '.join(held) or 'none'})")
        pairs = listed.setdefault((ti, gi), {})       # target suffix -> (golden's, line)
        t_suffix, g_suffix = rule.parts
        same = taken.get((ti, t_suffix))
        if same is not None and same[:2] == (g_suffix, gi):
            continue                                   # the same pair said twice
        clash = same[2] if same is not None else next(
            (line for g, line in pairs.values() if g == g_suffix), None)
        if clash is not None:
            raise MappingError(f"{where}: a tensor of this line is paired on line {clash} "
                               f"already; a tensor pairs with one tensor")
        pairs[t_suffix] = (g_suffix, rule.line)
        taken[(ti, t_suffix)] = (g_suffix, gi, rule.line)
    out: list[ForcedPair] = []
    for ti in sorted({t for t, _ in lines}):
        goldens = sorted(golden_of.get(ti, ())) or [partner[("target", ti)][0]]
        gi = goldens[-1]        # the latest golden record is the one alignment pairs it with
        chosen = {t: g for t, (g, _) in listed.get((ti, gi), {}).items()}
        if (ti, gi) in whole:       # the tensors both hold under one name, besides those listed
            g_held = set(_suffixes(joined[gi])) - set(chosen.values())
            chosen.update({s: s for s in _suffixes(kept[ti]) if s in g_held and s not in chosen})
        order = {s: n for n, s in enumerate(_suffixes(kept[ti]))}     # the record's own order
        borrowed = tuple(sorted(((t, _tensor(joined[g], suffix)) for g in goldens[:-1]
                                 for t, (suffix, _) in listed[(ti, g)].items()),
                                key=lambda p: order[p[0]]))
        at_lines = [n for g in goldens for n in lines[(ti, g)]]
        out.append(ForcedPair(ti, gi, tuple(sorted(chosen.items(), key=lambda p: order[p[0]])),
                              tuple(sorted(at_lines)), (kept[ti]["name"], _listed(
                                  [joined[g]["name"] for g in goldens])), borrowed,
                              tuple(goldens[:-1])))
    for one, next_one in zip(out, out[1:]):
        if min(next_one.others, default=next_one.golden) < one.golden:
            first, later = sorted((one.lines[0], next_one.lines[0]))
            raise MappingError(f"{mapping.path}:{later}: its records ran in the other order "
                               f"than those of line {first} on the two sides; forced pairs "
                               f"must keep both runs' order")
    return tuple(out)


def fed_ops(pairs: list[tuple[Optional[int], Optional[int]]], target: list[Record],
            golden: list[Record], forced: tuple[ForcedPair, ...], dataflow: tuple[bool, bool],
            in_regions: tuple[dict[int, Any], dict[int, Any]],
            graphs: Optional[tuple[RunGraph, RunGraph]] = None) -> dict[int, ForcedPair]:
    """alignment position -> the forced pair its one-sided op feeds, for the ops only one run
    executes whose results (through the dump's dataflow, that side's) feed nothing but forced
    pairs' records and such ops: eager attention's first matmul and softmax, where the file pairs
    SDPA's output with the last matmul's. They are that pair's computation, not unmatched ops."""
    out: dict[int, ForcedPair] = {}
    for side, records, flow in ((0, target, dataflow[0]), (1, golden, dataflow[1])):
        if not flow or not forced:
            continue
        owner = {(f.target if side == 0 else f.golden): f for f in forced}
        lone = {p[side]: k for k, p in enumerate(pairs) if p[1 - side] is None}
        reads = graphs[side].readers if graphs else readers(records)
        for i in sorted((i for i in lone if i is not None), reverse=True):   # readers first
            fed = reads.get(i, [])
            if records[i]["kind"] in Kind.OPS and i not in in_regions[side] and fed and \
                    all(k in owner for k in fed):
                owner[i] = out[lone[i]] = owner[min(fed)]
    return out


def covered(row: "TensorRow", pair: ForcedPair, path: str) -> "TensorRow":
    """An unmatched row of an op `fed_ops` gives to `pair`: covered by it."""
    return replace(row, result=PASS, reason=f"feeds only the mapping file's pair "
                                            f"{pair.said(path)}: judged through its tensors")


def borrowed(pairs: Iterable[ForcedPair]) -> set[str]:
    """The golden tensors forced pairs take from golden records other than their own (eager
    attention's first matmul's input, paired with SDPA's q): each is shown in the pair's row
    only, not again as its own record's unmatched or covered row."""
    return {tensor[0] for pair in pairs for _, tensor in pair.borrowed}


class CarriedInputs:
    """The inputs of a forced pair it did not measure, measured where the target made them."""

    def __init__(self, target: list[Record], dataflow: bool,
                 graph: Optional[RunGraph] = None) -> None:
        # seq -> record, of `graph` (the target's, when the caller has it: `graph.RunGraph`)
        self.by_seq: dict[int, Record] = (graph or RunGraph(target)).by_seq if dataflow else {}
        self.leaf_names: dict[tuple[Optional[str], Optional[str]], str] = {
            (r.get("leaf"), r.get("tensor")): r["name"] for r in target if r["kind"] == Kind.LEAF}

    def entries(self, record: Record, measured: dict[str, Entry]) -> Optional[list[Entry]]:
        """The measured entries of the tensors `record` reads (inputs and parameters) that
        were not measured as its own (`measured`: target tensor name -> entry), or None when
        one of them cannot be found where it was made."""
        out: list[Entry] = []
        for name, role, desc in iter_tensors(record):
            if role == Role.OUTPUT or name in measured or desc.get("overwritten"):
                continue
            producer, leaf = desc.get("producer"), desc.get("leaf")
            made: Optional[str] = None
            if producer:
                rec = self.by_seq.get(producer[0])
                made = f"{rec['name']}.output.{producer[1]}" if rec else None
            elif leaf in _LEAVES:
                rec_name = self.leaf_names.get((leaf, desc.get("fqn")))
                made = f"{rec_name}.output.0" if rec_name else None
            entry = measured.get(made) if made else None
            if entry is None:
                return None
            out.append(entry)
        return out


NOT_JUDGED = ("not judged on its own: the mapping file pairs it, and a tensor it reads is "
              "neither compared nor measured where it was made")


def not_judged(row: "TensorRow") -> "TensorRow":
    """An output row of a forced pair not judged on its own: its reason says so (once)."""
    if NOT_JUDGED in row.reason:
        return row
    return replace(row, reason=f"{row.reason}; {NOT_JUDGED}" if row.reason else NOT_JUDGED)


def judged(op: "OpScore", carried: Optional[list[Entry]], rows: list["TensorRow"]
           ) -> list[ForcedFacts]:
    """A forced pair's score given the inputs it did not measure (`carried`:
    `CarriedInputs.entries`), or, where one was found nowhere (None), its outputs not judged:
    their rows say so. What the compare decided of it, for `rejudge` ([]: nothing to keep)."""
    names = tuple(rows[i].target_name or "" for i, *_ in (
        carried if carried is not None else op.outputs))
    if carried is not None:
        op.inputs += carried
        return [ForcedFacts(op.name, inputs=names)] if names else []
    for i, *_ in op.outputs:
        rows[i] = not_judged(rows[i])
    op.outputs.clear()
    op.unjudged = bool(names)
    return [ForcedFacts(op.name, unjudged=names)] if names else []


def carry(facts: "PairFacts", scores: dict[str, "OpScore"], measured: dict[Optional[str], Entry]
          ) -> None:
    """Give each forced pair's score (`scores`, by op name) what the compare decided of it
    (`facts.ForcedFacts`): the inputs it took from where the target made them, or that its
    outputs are not judged; measured: target tensor -> its measured entry. What `rejudge` does
    again."""
    for pair in facts.forced:
        score = scores.get(pair.name)
        if score is not None:
            score.inputs += [measured[t] for t in pair.inputs if t in measured]
            score.unjudged = score.unjudged or bool(pair.unjudged)


def unjudged_note(names: list[str], differ: bool) -> Optional[str]:
    """"inconclusive: ..." for forced pairs not judged (`CarriedInputs.entries` None) when
    their tensors differ and nothing was blamed; else None."""
    if not names or not differ:
        return None
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (f"inconclusive: tensors differ, and {shown} (paired by the mapping file) could not "
            f"be judged: what {'it reads is' if len(names) == 1 else 'they read is'} neither "
            f"compared nor measured where it was made; no op elsewhere is blamed")


__all__ = ["ForcedPair", "resolve", "fed_ops", "covered", "borrowed", "CarriedInputs", "NOT_JUDGED",
           "not_judged", "judged", "carry", "unjudged_note"]
