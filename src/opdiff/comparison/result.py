"""What a compare produces: rows, verdicts and the first divergence. Report reads only these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ..store.schema import Location  # noqa: F401  (re-exported: other stages import it from here)
from .metric_table import METRICS  # noqa: F401  (re-exported: the metric column names, in CSV order)

if TYPE_CHECKING:
    from .facts import PairFacts
    from .layouts.facts import LayoutFacts
    from .tokens.where import TokenErrors

PASS, WARNING, ERROR, UNMATCHED = "pass", "warning", "error", "unmatched"

# Why an op is the culprit (`Divergence.kind`): what tests and tools read instead of the English.
LOCAL = "local"           # its output's error is an order of magnitude above its inputs'
SCALE = "scale"           # its output is scaled against golden, beyond what its inputs carry
REPLAY = "replay"         # re-run in float64 on the target's own inputs, its own error is too big
NUMBER = "number"         # its Python number arguments differ between the runs
NONFINITE = "nonfinite"   # inf/NaN appear in its output from finite inputs
INTEGER = "integer"       # its integer output differs although its inputs are equal
LEAF_KIND = "leaf"        # a parameter, buffer or input differs before any op (see `origin`)
RANDOM = "random"         # a random op drew from generators in different states
DIVERGENCE_KINDS = (LOCAL, SCALE, REPLAY, NUMBER, NONFINITE, INTEGER, LEAF_KIND, RANDOM)



class Origin:
    """Where a difference comes from (`Divergence.origin`), in the order the rules that decide
    it are tried (`opdiff.comparison.origins.RULES`: the first that holds gives the origin).
    The values are what summary.json writes. Declared here, beside `Divergence`, because
    origins.py builds Divergences (it imports this module); the rules are origins.py's."""
    # one pair: the earliest op still blamed (`origins.divergence`)
    PARAMETER = "parameter"     # a parameter differs before any op reads it (`tensor`: its FQN)
    BUFFER = "buffer"           # a buffer differs before any op reads it (`tensor`: its FQN)
    INPUT = "input"             # a model input differs before any op reads it
    OUTSIDE = "outside"         # a tensor changed between two recorded ops outside torch
    REGION = "region"           # ops the two runs do not share, judged as one (`Divergence.region`)
    RANDOM = "random"           # a random op drew from generators in different states
    NUMBER = "number"           # a Python number argument of the op differs
    OP = "op"                   # the op's own computation: inputs agree, outputs do not
    # across pairs: one pair's divergence seen from the others (`origins.across_pairs`)
    COLLECTIVE = "collective"   # received through a collective from another rank
    OPTIMIZER = "optimizer"     # parameters differ although step S-1 agreed: the update between

    ALL = (PARAMETER, BUFFER, INPUT, OUTSIDE, REGION, RANDOM, NUMBER, OP, COLLECTIVE, OPTIMIZER)
    LEAVES = (PARAMETER, BUFFER, INPUT)


# Below this share of tensors with a partner, a compare that found nothing is inconclusive.
MIN_COVERAGE = 0.5


class Note(str):
    """A note for the user (`CompareResult.notes`) that knows what it is about: code selects
    notes by `kind` (one of `Note.KINDS`), never by their words. It is the note's text as a
    str, so reports print it as they print any string; a plain str note is of kind OTHER.

        Note("replayed 3 op(s) in float64 in 0.20 s", Note.REPLAY).kind   # "replay"
    """
    INCONCLUSIVE = "inconclusive"   # the compare cannot tell there ("inconclusive: ...")
    THRESHOLDS = "thresholds"       # follows from the thresholds (statistics' floors): made again by rejudge
    REPLAY = "replay"               # what replay did (rejudge does not replay: no longer true there)
    REJUDGED = "rejudged"           # the result was judged again from its saved metrics
    PAIRING = "pairing"             # what the mapping file or the dumps' formats left unpaired or unused
    DUMPS = "dumps"                 # a step/rank or a side missing, cut short, or unreadable in part
    SHARDING = "sharding"           # tensors sharded differently in the two runs
    RANKS = "ranks"                 # where the other step/rank pairs' differences come from
    REPORT = "report"               # what a report leaves out
    OTHER = "other"                 # anything else (a plain str; a summary.json of an older opdiff)
    KINDS = (INCONCLUSIVE, THRESHOLDS, REPLAY, REJUDGED, PAIRING, DUMPS, SHARDING, RANKS, REPORT,
             OTHER)

    kind: str

    def __new__(cls, text: str, kind: str = OTHER) -> "Note":
        if kind not in cls.KINDS:
            raise ValueError(f"a note's kind is one of {', '.join(cls.KINDS)}, not {kind!r}")
        note = super().__new__(cls, text)
        note.kind = kind
        return note

    def __reduce__(self) -> tuple[Any, ...]:     # pickled (worker processes, Ray) with its kind
        return (Note, (str(self), self.kind))

    def __repr__(self) -> str:
        return f"Note({str.__repr__(self)}, {self.kind!r})"


def note_kind(note: str) -> str:
    """The kind of a note (`Note.KINDS`); Note.OTHER for a plain str."""
    return getattr(note, "kind", Note.OTHER)


def noted(text: Optional[str], kind: str) -> list[Note]:
    """[Note(text, kind)], or [] when there is nothing to say (`text` None or empty)."""
    return [Note(text, kind)] if text else []


def reworded(note: str, text: str) -> Note:
    """`text` (a note said again, e.g. prefixed with where it holds) with `note`'s kind."""
    return Note(text, note_kind(note))


@dataclass(frozen=True)
class TensorRow:
    """One compared tensor (or one unmatched tensor of either side)."""
    target_name: Optional[str]          # e.g. "Tensor.__iadd__.3.forward.input.0"; None if only golden has it
    golden_name: Optional[str]
    op_name: str                        # the record name, e.g. "Tensor.__iadd__.3.forward"
    role: str                           # "input" | "output" | "parameters"
    phase: str                          # "forward" | "backward"
    kind: str                           # "api" | "module" | "aten" | "param_grad" | "node" (onnx)
    index: int                          # position of the op in target execution order (golden's if unmatched)
    target_dtype: Optional[str] = None
    golden_dtype: Optional[str] = None
    target_shape: Optional[tuple[int, ...]] = None
    golden_shape: Optional[tuple[int, ...]] = None
    metrics: dict[str, Optional[float]] = field(default_factory=dict)        # METRICS name -> float | None
    target_stats: dict[str, Any] = field(default_factory=dict)   # max/min/mean/norm/nan/inf
    golden_stats: dict[str, Any] = field(default_factory=dict)
    result: str = PASS                  # PASS | WARNING | ERROR | UNMATCHED
    accuracy_reached: str = ""          # "Yes" | "No" | "" (unmatched)
    reason: str = ""                    # why this verdict, in words
    module: Optional[str] = None        # enclosing module call name
    stack: tuple[Location, ...] = ()                   # Location tuple, innermost user frame first
    mode: str = "tensor"                # "tensor" (full tensors) | "statistics" (stats only)
    error: Optional[float] = None       # relative L2 error the verdict used (see compare.metrics)
    scale_error: Optional[float] = None # <t,g>/<g,g> - 1: the systematic part of the error
    step: Optional[int] = None          # set when several step/rank pairs were compared
    rank: Optional[int] = None
    # What the blame rules read besides the metrics, so that a result re-judges (`rejudge`):
    forward: Optional[str] = None       # backward records: their forward call's record name
    differing_numbers: tuple[str, ...] = ()       # the op's number arguments that differ ("input.1: 2 vs 1")
    dtype_limits: tuple[str, ...] = ()            # ... that are dtype limits (finfo(fp16).min vs fp32's)
    leaf: Optional[str] = None          # Kind.LEAF records: "parameter" | "buffer" | "input"
    leaf_tensor: Optional[str] = None   # ... its FQN (or the input's slot)
    reader: Optional[str] = None        # ... the record of the first op that reads it
    leaf_strict: bool = True            # ... judged exactly (step 0: nothing trained it yet)
    rng: tuple[Optional[str], ...] = ()   # random ops: (target's, golden's) generator fingerprints
    leaf_input: Optional[str] = None    # an input row that is a leaf: "parameter <fqn>", "outside <name>"
    region: Optional[str] = None        # the tensor of an op in a region ("region 2 in model.layers.0.self_attn")
    # rows.jsonl of an older opdiff: what its pair's plan decided, as marks ("in:Region.2.forward",
    # "withheld:<op>", ...), read only by `facts.PairFacts.from_marks`; now `CompareResult.facts`
    boundary: tuple[str, ...] = ()


@dataclass(frozen=True)
class Divergence:
    """The first op whose inputs agree with golden but whose outputs do not."""
    name: str                           # record name, e.g. "Tensor.__iadd__.3.forward"
    op: str                             # e.g. "Tensor.__iadd__"
    phase: str
    reason: str                         # one sentence: why this op is the culprit
    location: Optional[Location]
    metrics: dict[str, Optional[float]]   # metrics of the worst output tensor
    tensor: Optional[str] = None        # the worst output tensor's name
    input_metrics: dict[str, Optional[float]] = field(default_factory=dict)   # of the worst input (agreeing)
    module: Optional[str] = None
    step: Optional[int] = None
    rank: Optional[int] = None
    context: tuple[tuple[int, str], ...] = ()                 # (line number, source text) around location.line
    kind: str = LOCAL                   # DIVERGENCE_KINDS: why, for machines
    # Where the difference comes from: one of `Origin.ALL`, decided by the rules of
    # `opdiff.comparison.origins`. For a leaf origin `tensor` is its FQN and
    # name/op/phase/location the first op that reads it.
    origin: str = Origin.OP
    # A region (`opdiff.comparison.regions`, origin `Origin.REGION`): both sides' ops,
    # {"target_ops": [{"name", "op", "location"}], "golden_ops": [...]}
    region: Optional[dict[str, Any]] = None
    # Origin parameter, carried over: the earlier step whose divergence the training steps since
    # carried into the weights (`origins.carried_over`); None otherwise
    carried_from: Optional[int] = None


@dataclass
class CompareResult:
    """Result of comparing one target dump with one golden dump (one step/rank pair, or merged)."""
    target: str
    golden: str
    rows: list[TensorRow]               # list[TensorRow] in target execution order
    first_divergence: Optional[Divergence]
    counts: dict[str, int]              # {"pass", "warning", "error", "unmatched"}
    environment_diff: list[dict[str, Any]] = field(default_factory=list)   # [{"key", "target", "golden"}]
    step: Optional[int] = None
    rank: Optional[int] = None
    pairs: list[Any] = field(default_factory=list)   # per step/rank summaries when several were compared
    files: dict[str, Any] = field(default_factory=dict)   # {"csv": path, "summary": path, "html": path}
    title: str = "opdiff compare"       # shown in reports ("opdiff onnx" for model compares)
    verdict: str = ""                   # one line: what the compare found, in words
    notes: list[str] = field(default_factory=list)   # things to know: `Note`s (a plain str: kind OTHER)
    failed: bool = False                # the `fail_on` condition held (CLI: exit 1)
    # what each pair's plan decided that the judge needs besides the rows (`facts.PairFacts`;
    # only pairs that decided something): summary.json "facts", read back by `rejudge`
    facts: list[PairFacts] = field(default_factory=list)
    # each layer output's error per token of matched token layouts (`tokens.TokenErrors`)
    token_errors: Optional[TokenErrors] = None
    # what was merged of each side laid out over ranks, and how, per step (`layouts.facts`)
    layouts: list[LayoutFacts] = field(default_factory=list)


    @property
    def coverage(self) -> Optional[float]:
        """The share of tensors that have a partner on the other side (None without rows): a
        compare that found nothing is "inconclusive" below `MIN_COVERAGE`."""
        return coverage(self.rows)


def coverage(rows: list[TensorRow]) -> Optional[float]:
    """The share of tensor rows that have a partner on the other side (None without rows)."""
    if not rows:
        return None
    return sum(1 for row in rows if row.result != UNMATCHED) / len(rows)


def count(rows: list[TensorRow]) -> dict[str, int]:
    """{"pass", "warning", "error", "unmatched"} -> how many rows have that result."""
    counts = {PASS: 0, WARNING: 0, ERROR: 0, UNMATCHED: 0}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    return counts
