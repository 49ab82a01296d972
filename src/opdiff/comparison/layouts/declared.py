"""The layout file (`--layout FILE`, `compare(layout=)`): how a run split its model by hand.

A run that splits modules itself with plain tensors (Megatron-style column- and row-parallel
linears, an all-reduce after the row-parallel one) records no DTensor placement, so nothing in
its dump says which tensors are shards. One small text file says it, one module a line:

    # split   module   [dim=D]   [ranks=0,1]
    column    0                      # weight split along dim 0 (its output features)
    row       2                      # weight split along dim 1 (its input features)
    column    h.0.attn.c_attn  dim=1 # GPT-2's Conv1D keeps its weight as [in, out]

`column`: the module's output is sharded along its last dim; its weight is split along `dim`
(default 0, `nn.Linear`'s `[out, in]`), its 1-D parameters (bias) along dim 0. `row`: its
input is sharded along its last dim and the op reading its weight (split along `dim`, default
1) makes a partial sum; its 1-D parameters are whole on every rank (added after the reduce).
`ranks` (default: every rank of the side) must be the ranks the dump holds. `#` starts a
comment; blank lines are skipped. A pipeline whose stages run on ranks in another order:

    stage 0 ranks=1               # stage 0 (the model's first blocks) runs on rank 1
    stage 1 ranks=0

chains the ranks in stage order (`chain.ChainedSource(ordered=True)`); `stage` and
`column`/`row` lines do not mix in one file yet.

`load` checks every line's shape (`LayoutError` naming file:line); `Declared.bind` checks it
against one side's dumps (a module whose parameters no record reads, a dim the weight lacks,
ranks the dump lacks) and `DeclaredSource` gives each rank's records with the placements the
file implies written onto them, as DTensor capture would have (`placement.from_placement`
reads them): the parameters' leaves, the outputs of the ops reading a split parameter, and
the partial gradients of a column-parallel op's inputs. The plan (`plan.py`) does the rest.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from ...errors import OpdiffError
from ...store.records import iter_tensors
from ...store.schema import Kind, Phase, Placement, Record
from ...store.source import DumpSource

if TYPE_CHECKING:
    from ..result import CompareResult, Note

MAX_LAYOUT_BYTES = 16 << 20
MAX_RANKS = 1 << 16           # a range `0-N` is made into a list: bounded
SPLITS = {"column": 0, "row": 1}          # the weight's dim each splits along by default
USAGE = ("write 'column MODULE [dim=D] [ranks=0,1]', 'row MODULE [dim=D] [ranks=0,1]' or "
         "'stage N ranks=R'")


class LayoutError(OpdiffError):
    """A layout file that cannot be read, or names what the dump does not hold."""


@dataclass(frozen=True)
class Split:
    """One line: module `module` split `kind` ("column"/"row"), its weight along `dim`."""
    line: int
    kind: str
    module: str
    dim: int
    ranks: Optional[tuple[int, ...]] = None


@dataclass(frozen=True)
class Stage:
    """One line: pipeline stage `stage` runs on `ranks` (one rank a stage, for now)."""
    line: int
    stage: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class LayoutFile:
    path: str
    splits: tuple[Split, ...] = ()
    stages: tuple[Stage, ...] = ()

    def where(self, split: Split) -> str:
        return f"{self.path}:{split.line}"


def load(path: "str | os.PathLike[str]") -> LayoutFile:
    """Parse a layout file; `LayoutError` names the file and the line."""
    from ...store import dumpfiles

    where = os.fspath(path)
    try:    # a regular file only, read without waiting: a FIFO or /dev/zero is refused
        text = dumpfiles.read_text(path, MAX_LAYOUT_BYTES)
    except dumpfiles.UnreadableText as e:
        if e.too_large:
            raise LayoutError(f"{where}: {e.problem}; a layout file names modules, it is never "
                              f"that large") from None
        raise LayoutError(f"{where}: cannot read the layout file ({e.problem}); pass a UTF-8 "
                          f"text file to --layout") from None
    splits: list[Split] = []
    stages: list[Stage] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        at = f"{where}:{number}"
        if words[0] == "stage":
            stages.append(_stage(at, number, words, stages))
        else:
            split = _split(at, number, words)
            if split.module in seen:
                raise LayoutError(f"{at}: module {split.module!r} is laid out already on line "
                                  f"{seen[split.module]}; give each module one line")
            seen[split.module] = number
            splits.append(split)
        if splits and stages:
            raise LayoutError(f"{at}: 'stage' and 'column'/'row' lines in one file (tensor "
                              f"parallel inside pipeline stages) are not merged yet")
    if not splits and not stages:
        raise LayoutError(f"{where}: says nothing; {USAGE}")
    numbers = sorted(s.stage for s in stages)
    if numbers != list(range(len(numbers))):
        missing = min(set(range(len(numbers) + 1)) - set(numbers))
        last = max(stages, key=lambda s: s.stage)
        raise LayoutError(f"{where}:{last.line}: stage {last.stage} without stage {missing}; "
                          f"number the stages 0, 1, 2, ... in the order the batch goes through")
    return LayoutFile(where, tuple(splits), tuple(stages))


def _stage(at: str, number: int, words: list[str], stages: list[Stage]) -> Stage:
    usage = "write 'stage N ranks=R' (N from 0, R the rank that runs it)"
    if len(words) != 3 or not words[1].isdigit() or not words[2].startswith("ranks="):
        raise LayoutError(f"{at}: {usage}")
    ranks = _ranks(at, words[2][len("ranks="):], least=1)
    if len(ranks) > 1:
        raise LayoutError(f"{at}: a stage over several ranks (tensor parallel inside a pipeline "
                          f"stage) is not merged yet; give one rank a stage")
    stage = int(words[1])
    for other in stages:
        if other.stage == stage:
            raise LayoutError(f"{at}: stage {stage} is given already on line {other.line}")
        if set(other.ranks) & set(ranks):
            raise LayoutError(f"{at}: rank {ranks[0]} runs stage {other.stage} already (line "
                              f"{other.line})")
    return Stage(number, stage, ranks)


def _split(at: str, number: int, words: list[str]) -> Split:
    kind = words[0]
    if kind not in SPLITS:
        raise LayoutError(f"{at}: unknown word {kind!r}; {USAGE}")
    if len(words) < 2 or "=" in words[1]:
        raise LayoutError(f"{at}: {kind!r} needs a module path; {USAGE}")
    module = words[1]
    if any(not part for part in module.split(".")) or not module.isprintable():
        raise LayoutError(f"{at}: {module!r} is not a module path (dotted names: 'layers.0.mlp')")
    dim, ranks = SPLITS[kind], None
    given: set[str] = set()
    for word in words[2:]:
        key, eq, value = word.partition("=")
        if not eq or key not in ("dim", "ranks") or key in given:
            raise LayoutError(f"{at}: {word!r} is not understood here; {USAGE}")
        given.add(key)
        if key == "dim":
            if not value.isdigit():
                raise LayoutError(f"{at}: dim={value!r}: give the weight's dim as a whole number "
                                  f"0 or more")
            dim = int(value)
        else:
            ranks = _ranks(at, value)
    return Split(number, kind, module, dim, ranks)


def _ranks(at: str, value: str, least: int = 2) -> tuple[int, ...]:
    """`0,1,2,3` or `0-3`."""
    out: list[int] = []
    for part in value.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise LayoutError(f"{at}: ranks={value!r}: give ranks as '0,1' or '0-3'")
        if dash and int(high) - int(low) > MAX_RANKS:
            raise LayoutError(f"{at}: ranks={value!r}: more than {MAX_RANKS} ranks")
        out += list(range(int(low), int(high) + 1)) if dash else [int(low)]
    if len(set(out)) != len(out) or len(out) < least:
        raise LayoutError(f"{at}: ranks={value!r}: give "
                          f"{'two or more different ranks' if least > 1 else 'different ranks'}")
    return tuple(out)


@dataclass(frozen=True)
class Param:
    """What the file says of one parameter: split along `dim` (None: whole on every rank)."""
    split: Split
    dim: Optional[int]


class Declared:
    """A layout file bound to one side's ranks of one step (`bind`)."""

    def __init__(self, layout: LayoutFile, params: dict[str, Param], ranks: list[int],
                 order: Optional[list[int]] = None):
        self.layout, self.params, self.ranks = layout, params, ranks
        self.order = order          # pipeline: the ranks in stage order; None: no stage lines

    @staticmethod
    def bind(layout: LayoutFile, sources: Sequence[DumpSource], side: str) -> "Declared":
        """Check every line against the side's dumps of one step; `LayoutError` names the line."""
        ranks = sorted(int(s.rank if s.rank is not None else i) for i, s in enumerate(sources))
        if layout.stages:
            return Declared(layout, {}, ranks, _stage_order(layout, ranks, side))
        shapes: dict[str, list[int]] = {}
        for rec in sources[0].records():
            if rec.get("kind") == Kind.LEAF and rec.get("leaf") == "parameter" and rec["outputs"]:
                shapes[str(rec.get("tensor", ""))] = list(rec["outputs"][0].get("shape") or [])
        params: dict[str, Param] = {}
        for split in layout.splits:
            at = layout.where(split)
            if split.ranks is not None and sorted(split.ranks) != ranks:
                missing = sorted(set(split.ranks) - set(ranks))
                said = (f"rank(s) {missing} are not in the {side}'s dump (it holds ranks {ranks})"
                        if missing else f"the {side}'s dump holds ranks {ranks}: give them all "
                        f"(a module split over part of them is not merged yet)")
                raise LayoutError(f"{at}: ranks={','.join(map(str, split.ranks))}: {said}")
            mine = {fqn: shape for fqn, shape in shapes.items()
                    if fqn.startswith(split.module + ".") and "." not in
                    fqn[len(split.module) + 1:]}
            if not mine:
                raise LayoutError(f"{at}: no parameter of a module {split.module!r} is recorded "
                                  f"in the {side}'s dump (give the module's path as the model "
                                  f"names it, 'layers.0.mlp.up_proj')")
            weights = [s for s in mine.values() if len(s) >= 2]
            if weights and split.dim >= min(len(s) for s in weights):
                raise LayoutError(f"{at}: dim={split.dim}: the weight of {split.module!r} has "
                                  f"{min(len(s) for s in weights)} dims")
            for fqn, shape in mine.items():
                if len(shape) >= 2:
                    params[fqn] = Param(split, split.dim)
                else:
                    params[fqn] = Param(split, 0 if split.kind == "column" else None)
        return Declared(layout, params, ranks)

    def wrap(self, source: DumpSource) -> "DeclaredSource":
        rank = int(source.rank) if source.rank is not None else 0
        return DeclaredSource(source, self, self.ranks.index(rank) if rank in self.ranks else 0)


def _stage_order(layout: LayoutFile, ranks: list[int], side: str) -> list[int]:
    """The side's ranks in the order of the stages they run; every rank runs one."""
    for stage in layout.stages:
        if stage.ranks[0] not in ranks:
            raise LayoutError(f"{layout.path}:{stage.line}: rank {stage.ranks[0]} is not in the "
                              f"{side}'s dump (it holds ranks {ranks})")
    named = {stage.ranks[0] for stage in layout.stages}
    if named != set(ranks):
        raise LayoutError(f"{layout.path}: no stage line for rank(s) {sorted(set(ranks) - named)} "
                          f"of the {side}'s dump; give every rank its stage")
    return [stage.ranks[0] for stage in sorted(layout.stages, key=lambda s: s.stage)]


def _placement(name: str, coordinate: int) -> Placement:
    return {"placements": [name], "coordinate": [coordinate], "declared": True}


class Unlaid:
    """One rank's dump of a side laid out over ranks that nothing says the layout of (no
    DTensor placement, no pipeline, no layout file), as it is: compared rank by rank, its pair's
    culprit is not claimed (`unclaimed`)."""

    def __init__(self, source: DumpSource):
        self.source = source
        self.path, self.meta = source.path, source.meta
        self.step, self.rank, self.format = source.step, source.rank, source.format

    def records(self) -> Iterator[Record]:
        return self.source.records()

    @property
    def holds_tensors(self) -> bool:
        return self.source.holds_tensors

    def tensor(self, key: str) -> Any:
        return self.source.tensor(key)

    def tensor_keys(self) -> list[str]:
        return self.source.tensor_keys()

    def stack(self, stack_id: Optional[int]) -> list[dict[str, Any]]:
        return self.source.stack(stack_id)

    def record_count(self) -> int:
        count = getattr(self.source, "record_count", None)
        return int(count()) if callable(count) else sum(1 for _ in self.source.records())


class DeclaredSource(Unlaid):
    """One rank's dump with the placements its layout file implies (see the module docstring);
    everything else is the dump's own."""

    def __init__(self, source: DumpSource, declared: Declared, coordinate: int):
        super().__init__(source)
        self.declared, self.coordinate = declared, coordinate

    def records(self) -> Iterator[Record]:
        params = self.declared.params
        made: dict[str, tuple[str, list[int]]] = {}     # forward name -> (kind, free inputs)
        for rec in self.source.records():
            if rec.get("kind") == Kind.LEAF and str(rec.get("tensor", "")) in params:
                yield self._leaf(rec, params[str(rec["tensor"])])
                continue
            if rec.get("phase") == Phase.BACKWARD and rec.get("forward") in made:
                yield self._backward(rec, *made[str(rec["forward"])])
                continue
            read = [(i, params.get(str(d.get("fqn")))) if isinstance(d, dict) and
                    d.get("leaf") == "parameter" else (i, None)
                    for i, d in enumerate(rec["inputs"])]
            split = [p for _, p in read if p is not None and p.dim is not None]
            if not split or rec.get("phase") != Phase.FORWARD or rec.get("kind") == Kind.LEAF \
                    or str(rec.get("op")).endswith("_"):    # (an optimizer's in-place update)
                yield rec
                continue
            kind = split[0].split.kind
            made[str(rec.get("name"))] = (kind, [i for i, p in read if p is None])
            yield self._forward(rec, kind)

    def _leaf(self, rec: Record, param: Param) -> Record:
        out = copy.deepcopy(rec)
        name = "R" if param.dim is None else f"S({param.dim})"
        for desc in out["outputs"]:
            if isinstance(desc, dict) and desc.get("shape") is not None:
                desc["placement"] = _placement(name, self.coordinate)
        return out

    def _forward(self, rec: Record, kind: str) -> Record:
        """An op reading a split parameter: its outputs sharded along their last dim (column) or
        partial sums (row)."""
        out = copy.deepcopy(rec)
        for _, role, desc in iter_tensors(out):
            if role == "output" and desc.get("shape"):
                desc["placement"] = _placement("S(-1)" if kind == "column" else "P(sum)",
                                               self.coordinate)
        return out

    def _backward(self, rec: Record, kind: str, free: list[int]) -> Record:
        """Column: the op's gradients of its inputs that are not parameters are each rank's
        summand of the whole (Megatron all-reduces them before the op before). Row: the
        gradient of its partial output is whole on every rank."""
        out = copy.deepcopy(rec)
        if kind == "row":
            for desc in out["inputs"]:
                if isinstance(desc, dict) and desc.get("shape") is not None:
                    desc["placement"] = _placement("R", self.coordinate)
            return out
        for i, desc in enumerate(out["outputs"]):
            if i in free and isinstance(desc, dict) and desc.get("shape") is not None:
                desc["placement"] = _placement("P(sum)", self.coordinate)
        return out


def unused(layout: LayoutFile, side: str, why: str) -> "Note":
    """The note for a layout file that had nothing to say: `why` its side needed none."""
    from ..result import Note
    return Note(f"the {side}'s layout file {layout.path} was not used: {why}", Note.PAIRING)


def unclaimed(result: "CompareResult", side: str) -> "CompareResult":
    """A rank-by-rank pair of an `Unlaid` side: no culprit claimed (a shard against the whole
    differs where nothing went wrong), and "inconclusive: ..." saying what would tell."""
    from dataclasses import replace

    from ..result import Note
    note = Note(f"inconclusive: the {side}'s ranks split the model in a way its dump does not "
                f"record (no DTensor placement, no pipeline send or receive), so each rank "
                f"holds pieces of tensors the other side holds whole; give a layout file "
                f"(--layout) saying which modules are split", Note.INCONCLUSIVE)
    return replace(result, first_divergence=None, notes=[*result.notes, note])


__all__ = ["LayoutFile", "LayoutError", "Split", "Stage", "load", "Declared", "DeclaredSource", "Unlaid",
           "unclaimed", "unused"]
