"""The record schema: kinds, phases, the record's fields, and the grammar of record names.

Every stage speaks this: capture builds names with `RecordName(...).text`, the adapters turn
foreign names into it, the comparison, overflow and report parse names with `RecordName.parse`.
Nothing else builds a name with an f-string or takes one apart with a regex.

Name forms (msprobe's scheme, which Ascend users read fluently)::

    Functional.conv2d.0.forward               api / aten: {op}.{index}.{phase}
    Module.layer1.0.conv1.Conv2d.forward.0    module:     {op}.{phase}.{index}, op = Module.{path}.{Class}
    Module.fc.Linear.parameters_grad.0        param_grad: {op}.parameters_grad.{index}
    Tensor___iadd___0_forward                 ptdbg_ascend's legacy form (parsed, never written)

Tensor names add a role and a slot: `Functional.conv2d.0.forward.input.0`,
`Module.fc.Linear.forward.0.parameters.weight`, `Module.fc.Linear.parameters_grad.0.weight`.

    >>> RecordName.parse("Module.fc.Linear.forward.0")
    RecordName(op='Module.fc.Linear', phase='forward', index=0, kind='module')
    >>> RecordName("Tensor.__iadd__", "forward", 3).text
    'Tensor.__iadd__.3.forward'
"""
# (no `from __future__ import annotations`: TypedDict reads `Required[...]` from evaluated annotations)
import re
from dataclasses import dataclass
from typing import Any, Dict, Final, Iterable, List, Mapping, Optional, Tuple, Union, cast

from typing_extensions import Literal, Required, TypedDict


class Kind:
    """What a record is a call of."""
    API: Final = "api"                # a torch API call (L1)
    MODULE: Final = "module"          # an nn.Module call (L0)
    ATEN: Final = "aten"              # an aten op (L2)
    PARAM_GRAD: Final = "param_grad"  # a module's parameter gradients
    NODE: Final = "node"              # an ONNX graph node
    LEAF: Final = "leaf"              # a parameter, buffer or input, at its first read in the step
    KERNEL: Final = "kernel"          # a compiled kernel Inductor generated (L2 under torch.compile)

    ALL = (API, MODULE, ATEN, PARAM_GRAD, NODE, LEAF, KERNEL)
    REPLAYABLE = (API, ATEN)    # modules and parameter gradients are made of other ops
    OPS = (API, ATEN, KERNEL)   # op calls: what regions hold, whose outputs inputs name


class Phase:
    FORWARD: Final = "forward"
    BACKWARD: Final = "backward"

    ALL = (FORWARD, BACKWARD)


class Role:
    """Where a tensor sits in its record (the middle word of a tensor name)."""
    INPUT = "input"
    OUTPUT = "output"
    PARAMETERS = "parameters"


# The types below are the one source of the record format: `opdiff.store.record_schema` makes
# the JSON Schema of a records.jsonl line (schemas/dump-record.schema.json) and the docs' dump
# format page from them, the comment beside each field being its description. A field capture
# writes that is not typed here fails tests/store/test_record_types.py.

NonFinite = Literal["NaN", "Infinity", "-Infinity"]   # a float strict JSON cannot spell
StatValue = Union[float, NonFinite, None]               # None: unknown (a foreign dump's overflow)


class Statistics(TypedDict, total=False):
    """A tensor's statistics (`opdiff.store.statistics.STATISTICS` names them, in this order)."""
    max: StatValue              # largest value (NaN where one is NaN)
    min: StatValue              # smallest value
    mean: StatValue             # mean over every element
    norm: StatValue             # L2 norm
    nan: Optional[int]          # how many elements are NaN
    inf: Optional[int]          # how many elements are +-inf


class Placement(TypedDict, total=False):
    """Which part of a DTensor's global tensor a local shard is (capture/collectives.py)."""
    placements: List[str]       # the DTensor's placements as torch prints them (Shard(dim=0))
    coordinate: Optional[List[int]]   # this rank's coordinate in the device mesh
    global_shape: Optional[List[int]]   # the global tensor's shape (null: opdiff compare's
    #                                     records, a mesh dim's piece, not known)
    whole: Optional[bool]       # the local tensor holds every value of the global one
    declared: bool              # opdiff compare's records: read from a layout file, not the dump (never in a dump)


class RankPiece(TypedDict, total=False):
    """One rank's part of a tensor opdiff compare joined from several ranks (never in a dump)."""
    rank: Required[int]         # the rank that held it
    shape: Required[List[int]]  # its shape there
    offset: int                 # a shard: where it starts along the sharded dim


class Descriptor(TypedDict, total=False):
    """One argument: a tensor, a Python scalar, None, a dtype/device/size, a list, tuple or dict
    of descriptors, or an object's repr (`opdiff.store.records`)."""
    type: Required[Literal["tensor", "int", "float", "bool", "str", "none", "dtype", "device",
                           "size", "list", "tuple", "dict", "object"]]   # what the argument is
    value: Any                  # scalars, dtype, device, size: the value; object: its repr, cut short
    items: Union[List["Descriptor"], Dict[str, "Descriptor"]]   # list/tuple: descriptors; dict: name to descriptor
    dtype: str                  # tensors: torch's dtype name without `torch.` (float32)
    shape: List[int]            # tensors: the shape
    device: str                 # tensors: cpu, cuda:0 ...
    requires_grad: bool         # tensors: as torch says
    stats: Optional[Statistics]   # tensors: their statistics (null: none taken, its values mean nothing)
    key: str                    # the tensor's name in the tensors/*.safetensors shards (task="tensor")
    overwritten: bool           # written by the op without being read: its values mean nothing
    uninitialized: bool         # torch.empty's output: its values mean nothing
    producer: Tuple[int, int]   # dataflow: [seq, output slot] of the record in this step that made this input
    leaf: Literal["parameter", "buffer", "input", "outside"]   # a leaf read here (outside: written outside torch)
    fqn: str                    # leaf: the parameter's or buffer's FQN, the input's slot, or the tensor's name
    outside: bool               # its values changed outside torch since it was last described (capture/handles.py)
    placement: Placement        # a DTensor's local shard: which part of the global tensor it is
    saved_shape: Optional[List[int]]   # opdiff compare's records: a tensor compared in another
    #                                    shape than the one it was saved in, that one (never in a dump)
    layout: str                 # opdiff compare's records joined across ranks: how the pieces
    #                             join (shard(0), replicate, partial(sum)...) (never in a dump)
    pieces: List[RankPiece]     # ... where the joined tensor came from, one piece per rank
    outer_placement: Placement  # ... while joining a mesh dim: the placement over the other dims


class ProgramRef(TypedDict):
    """A kernel input (the record's index-th input) or an earlier step's result."""
    ref: Literal["input", "step"]   # a kernel input or an earlier step
    index: int                  # which one, from 0


class ProgramList(TypedDict):
    """A list argument of a program's step (`torch.cat`'s tensors): references or constants."""
    type: Literal["list"]       # a list
    items: List["ProgramArgument"]   # its items


ProgramArgument = Union[ProgramRef, ProgramList, Descriptor]   # a reference, a list of either, or a constant


class ProgramStep(TypedDict, total=False):
    """One aten op of a kernel's program."""
    op: Required[str]           # the op as capture names it (Aten.mul)
    args: Required[List[ProgramArgument]]   # its positional arguments
    kwargs: Required[Dict[str, ProgramArgument]]   # its keyword arguments
    node: str                   # the post-grad FX node it stands for
    decomposed: List[str]       # the FX nodes of the decomposition it stands for
    item: int                   # the op returns several tensors: this step is its item-th (var_mean)


class ProgramOutput(TypedDict):
    """Which step (or input) lands in a kernel's output."""
    output: int                 # the kernel's output slot
    value: ProgramRef           # what it holds


class Program(TypedDict):
    """What a kernel computes: the aten ops of the FX nodes Inductor fused into it."""
    steps: List[ProgramStep]    # in order; a step reads kernel inputs, earlier steps or constants
    outputs: List[ProgramOutput]   # which step lands in which output


class Unmapped(TypedDict):
    """A kernel whose program could not be rebuilt."""
    unmapped: str               # why


class CompiledFacts(TypedDict, total=False):
    """What torch.compile knew of the code that ran an op (`capture/compiled.py`, `capture/inductor.py`)."""
    graph: str                  # the FX graph's code file (<eval_with_key>.5) or Inductor's wrapper file
    backend: Literal["inductor"]   # Inductor's generated code ran it (`is_inductor`): an extern
    #                                kernel or one of its own
    node: str                   # the FX node (mul_3), or for kind kernel the kernel's name (cpp_fused_mul_silu_0)
    module: str                 # the FX node's module path (model.layers.0.mlp)
    modules: List[str]          # Inductor calls: the modules of the FX nodes this call computes
    seq_nr: int                 # autograd's sequence number of the forward op (a backward node carries its forward's)
    source: Tuple[str, int]     # the user's source line: [file, line]
    from_parameters: List[Tuple[int, List[str]]]   # kernels at mix: [output, [parameter FQNs]]
    #                                                for each output computed from parameters and buffers alone
    kernels: List[str]          # opdiff compare's module calls made of Inductor kernels: their
    #                             names (in a compare's records, never in a dump)
    span: List[str]             # ... a span of module calls judged as one: the calls' records
    outputs_of: List[str]       # ... the span's call that made each output
    recomputes: List[str]       # ... modules whose code the span's kernels recompute


class Group(TypedDict, total=False):
    """A collective's process group (capture/collectives.py)."""
    ranks: List[int]            # the group's global ranks
    seq: int                    # this collective's number within the group
    peer: int                   # point-to-point: the other rank


class Record(TypedDict, total=False):
    """One line of records.jsonl (a plain dict at run time: no cost on capture's hot path).

    Every record a stage is handed is complete (`complete`, called once where a dump is read):
    the fields up to `stack` are always there, a missing one filled with the default its comment
    names, so readers index them (`record["kind"]`). The fields after `stack` are facts only some
    records have; they stay absent when unknown and are read with `record.get(...)`.
    Descriptors are documented in `opdiff.store.records`.
    """
    seq: Optional[int]          # execution order within this step/rank (default None: unknown)
    name: Required[str]         # RecordName text, unique within the step (required)
    op: Required[str]           # the name without counter and phase (default: taken from the name)
    kind: Required[Literal["api", "module", "aten", "param_grad", "node", "leaf", "kernel"]]   # Kind (default "api")
    phase: Required[Literal["forward", "backward"]]   # Phase (default "forward")
    module: Optional[str]       # the enclosing module call's name (default None: none known)
    inputs: List[Descriptor]    # one per positional argument; backward: gradients w.r.t. the
    #                             forward outputs (default [])
    kwargs: Dict[str, Descriptor]   # keyword arguments by name (default {})
    outputs: List[Descriptor]   # one per output; backward: gradients w.r.t. the forward inputs (default [])
    parameters: Dict[str, Descriptor]   # module calls and param_grad records: one per parameter (default {})
    stack: Optional[int]        # id of the call site in stacks.jsonl (default None: no stack)
    forward: Optional[str]      # backward records: their forward record's name (null: not known)
    autograd_node: str          # aten backward ops: the autograd node that ran them (MulBackward0)
    error: str                  # capture failed partly for this op: why
    leaf: Literal["parameter", "buffer", "input"]   # Kind.LEAF records: what the tensor is
    tensor: str                 # ... the parameter's or buffer's FQN, or the input's slot
    reader: str                 # ... the record of the first op that reads it
    rng: str                    # random ops: a fingerprint of the generator state they drew from
    group: Group                # collectives: their process group
    compiled: CompiledFacts     # an op run from a torch.compile'd graph, or by Inductor's generated code
    program: Union[Program, Unmapped]   # Kind.KERNEL, tensor dumps: its fused aten ops over its
    #                                     arguments, which opdiff check replays, or {"unmapped": why}
    #                                     (capture/kernel_programs.py)
    overflow: Literal["origin", "discarded"]   # overflow checking: an op that made inf/NaN of
    #                                            finite inputs (discarded: it reached no gradient,
    #                                            parameter or output)
    note: str                   # overflow origins: what to keep in mind reading it (an in-place op's inputs)


INDUCTOR = "inductor"   # CompiledFacts.backend of Inductor's generated code


def is_inductor(record: Mapping[str, Any]) -> bool:
    """Whether a record is a call of Inductor's generated code: one of its kernels (kind
    kernel) or an extern kernel its wrapper calls. The one spelling of it, for capture and
    comparison alike."""
    compiled = record.get("compiled")
    return isinstance(compiled, dict) and compiled.get("backend") == INDUCTOR


def compiled_facts(record: Optional[Record]) -> CompiledFacts:
    """A record's compiled facts, {} for an eager record (or no record)."""
    return (record.get("compiled") if record is not None else None) or {}


def complete(record: dict[str, Any]) -> Record:
    """The record with every defaulted field of `Record` filled, in place (and returned).

    Called once for each record where a dump is read (`opdiff.store.reader.Dump.records`, the
    adapters in `opdiff.store.adapters`), so that no stage after it re-applies a default:

        >>> complete({"name": "Functional.relu.0.forward", "inputs": None})  # doctest: +NORMALIZE_WHITESPACE
        {'name': 'Functional.relu.0.forward', 'inputs': [], 'outputs': [], 'kwargs': {},
         'parameters': {}, 'kind': 'api', 'phase': 'forward', 'module': None, 'stack': None,
         'seq': None, 'op': 'Functional.relu'}

    A field that is present keeps its value, except that a null `inputs`, `outputs`, `kwargs`
    or `parameters` becomes empty (dumps may write null for "none"). Idempotent and cheap: it
    runs for every record a compare reads.
    """
    get = record.get
    # A fresh container each: a stage may extend one record's list without touching another's.
    if get("inputs") is None:
        record["inputs"] = []
    if get("outputs") is None:
        record["outputs"] = []
    if get("kwargs") is None:
        record["kwargs"] = {}
    if get("parameters") is None:
        record["parameters"] = {}
    setdefault = record.setdefault
    setdefault("kind", Kind.API)
    setdefault("phase", Phase.FORWARD)
    setdefault("module", None)
    setdefault("stack", None)
    setdefault("seq", None)
    if "op" not in record:
        name = get("name", "")
        parts = name_parts(name) if type(name) is str else None
        record["op"] = record_op(parts[0], parts[3]) if parts is not None else name
    # The seam where a parsed dict becomes a typed record: every reader checks it first
    # (`opdiff.store.records.record_problem`) and the defaults above are now filled.
    return cast(Record, record)


PARAM_GRAD_WORD = "parameters_grad"
# The namespaces of API names (`Functional.conv2d`); ptdbg_ascend's underscore form starts with one.
API_PREFIXES = ("Tensor", "Torch", "Functional", "VF", "NPU", "Distributed", "Aten")
# Module calls: `Module.` (PyTorch); msprobe names MindSpore's modules `Cell.`.
MODULE_PREFIXES = ("Module", "Cell")
_PHASES = "|".join(Phase.ALL)
_ROLES = "input|output|parameters"
_API = re.compile(rf"^(?P<op>.+)\.(?P<index>\d+)\.(?P<phase>{_PHASES})$")
_MODULE = re.compile(rf"^(?P<op>(?:{'|'.join(MODULE_PREFIXES)})\..+)\.(?P<phase>{_PHASES})\.(?P<index>\d+)$")
_PARAM_GRAD = re.compile(rf"^(?P<op>.+)\.{PARAM_GRAD_WORD}\.(?P<index>\d+)$")
_LEGACY = re.compile(rf"^(?P<prefix>{'|'.join(API_PREFIXES)})_(?P<api>.+?)_"
                     rf"(?:(?P<index>\d+)_)?(?P<phase>{_PHASES})$")
_PARAM_GRAD_TENSOR = re.compile(rf"^(?P<record>.+\.{PARAM_GRAD_WORD}\.\d+)\.(?P<slot>.+)$")
# A tensor of a named call: the record part ends in its counter and phase, so a module path
# with a part named like a role (BERT's `layer.0.output.dense`) stays in the record.
_CALL_TENSOR = re.compile(rf"^(?P<record>.+?\.(?:\d+\.(?:{_PHASES})|(?:{_PHASES})\.\d+))"
                          rf"\.(?P<role>{_ROLES})\.(?P<slot>.+)$")
# Any other record (an ONNX node `/conv1/Conv`): the first role word splits.
_TENSOR = re.compile(rf"^(?P<record>.+?)\.(?P<role>{_ROLES})\.(?P<slot>.+)$")


@dataclass(frozen=True)
class RecordName:
    """A record name taken apart: op, phase, per-name call index and kind."""
    op: str
    phase: str = Phase.FORWARD
    index: int = 0
    kind: str = Kind.API

    @property
    def text(self) -> str:
        """The name as dumps spell it."""
        if self.kind == Kind.PARAM_GRAD:
            return f"{self.op}.{PARAM_GRAD_WORD}.{self.index}"
        if self.kind == Kind.MODULE:
            return f"{self.op}.{self.phase}.{self.index}"
        return f"{self.op}.{self.index}.{self.phase}"

    def __str__(self) -> str:
        return self.text

    @property
    def record_op(self) -> str:
        """The record's `op` field: the op, except that a parameter-gradient record's op keeps
        the word (`Module.fc.Linear.parameters_grad`, as capture and msprobe write it)."""
        return record_op(self.op, self.kind)

    @classmethod
    def parse(cls, name: str) -> Optional["RecordName"]:
        """The parts of any name form above, or None for a name of no known form."""
        parts = name_parts(name)
        return cls(*parts) if parts is not None else None

    def with_phase(self, phase: str) -> "RecordName":
        """The same call in the other phase (a backward record's forward, say)."""
        kind = Kind.MODULE if self.kind == Kind.PARAM_GRAD else self.kind
        return RecordName(self.op, phase, self.index, kind)

    @property
    def without_index(self) -> str:
        """The name with its call counter dropped (`Functional.relu.forward`): what a `list`
        entry written without a counter matches."""
        if self.kind == Kind.PARAM_GRAD:
            return f"{self.op}.{PARAM_GRAD_WORD}"
        return f"{self.op}.{self.phase}"


def name_parts(name: str) -> Optional[tuple[str, str, int, str]]:
    """`RecordName.parse(name)` as a plain (op, phase, index, kind) tuple, for the hot path
    (an adapter parses every record's name); None for a name of no known form."""
    # The last part tells the forms apart, so one pattern is tried, not four.
    tail = name[name.rfind(".") + 1:]
    if tail.isdigit():
        m = _PARAM_GRAD.match(name)
        if m:
            return m["op"], Phase.BACKWARD, int(m["index"]), Kind.PARAM_GRAD
        m = _MODULE.match(name)
        if m:
            return m["op"], m["phase"], int(m["index"]), Kind.MODULE
        return None
    if tail in Phase.ALL:
        m = _API.match(name)
        if m:
            op = m["op"]
            return op, m["phase"], int(m["index"]), Kind.ATEN if op.startswith("Aten.") else Kind.API
    m = _LEGACY.match(name)
    if m:
        return f"{m['prefix']}.{m['api']}", m["phase"], int(m["index"] or 0), Kind.API
    return None


def record_op(op: str, kind: str) -> str:
    """`RecordName.record_op` of these parts: `{op}.parameters_grad` for parameter gradients."""
    return f"{op}.{PARAM_GRAD_WORD}" if kind == Kind.PARAM_GRAD else op


def record_name(op: str, phase: str, index: int, kind: str = Kind.API) -> str:
    """`RecordName(op, phase, index, kind).text`, for the hot path."""
    if kind == Kind.MODULE:
        return f"{op}.{phase}.{index}"
    if kind == Kind.PARAM_GRAD:
        return f"{op}.{PARAM_GRAD_WORD}.{index}"
    return f"{op}.{index}.{phase}"


def legacy_to_dotted(name: str) -> str:
    """ptdbg_ascend's `Tensor___iadd___0_forward` -> `Tensor.__iadd__.0.forward`; other names
    unchanged (a legacy name without a counter keeps none: `Tensor.__iadd__.forward`)."""
    m = _LEGACY.match(name)
    if not m:
        return name
    if m["index"] is None:
        return f"{m['prefix']}.{m['api']}.{m['phase']}"
    return f"{m['prefix']}.{m['api']}.{m['index']}.{m['phase']}"


def tensor_name(record: str, role: str, slot: Any) -> str:
    """`Functional.conv2d.0.forward.input.0`; a param_grad record's tensors take no role word
    (`Module.fc.Linear.parameters_grad.0.weight`)."""
    if role == Role.PARAMETERS and _PARAM_GRAD.match(record):
        return f"{record}.{slot}"
    return f"{record}.{role}.{slot}"


def split_tensor_name(name: str) -> tuple[str, Optional[str], Optional[str]]:
    """(record name, role, slot) of a tensor name; role and slot None when the name has none."""
    m = _PARAM_GRAD_TENSOR.match(name)
    if m:
        return m["record"], Role.PARAMETERS, m["slot"]
    m = _CALL_TENSOR.match(name) or _TENSOR.match(name)
    if not m:
        return name, None, None
    return m["record"], m["role"], m["slot"]


def module_path(op: str) -> str:
    """`Module.layer1.0.conv1.Conv2d` -> `layer1.0.conv1` (the FQN `named_modules()` gives;
    "" for the root module)."""
    parts = op.split(".")
    if parts[:1] != ["Module"]:
        return ""
    return ".".join(parts[1:-1])


def module_class(op: str) -> str:
    """`Module.layer1.0.conv1.Conv2d` -> `Conv2d`."""
    return op.rsplit(".", 1)[-1] if op.startswith("Module.") else ""


def module_op(path: str, cls: str) -> str:
    """The op of a module call: `Module.{path}.{Class}` (`Module.{Class}` for the root)."""
    return f"Module.{path}.{cls}" if path else f"Module.{cls}"


def param_grad_links(name: str) -> list[str]:
    """The module calls a `...parameters_grad.N` record was computed from: its forward and
    backward call (dW = f(forward input, grad of forward output)); [] for other names."""
    parsed = RecordName.parse(name)
    if parsed is None or parsed.kind != Kind.PARAM_GRAD:
        return []
    return [parsed.with_phase(Phase.FORWARD).text, parsed.with_phase(Phase.BACKWARD).text]


@dataclass(frozen=True)
class Location:
    """The user's source line for an op (innermost frame outside torch and opdiff)."""
    file: str
    line: int
    code: str = ""
    function: str = ""


def locations_from_frames(frames: Optional[Iterable[dict[str, Any]]]) -> tuple[Location, ...]:
    """Location tuple from stored frames ({"file", "line", "code", "function"}), innermost first;
    malformed frames are skipped."""
    out = []
    for f in frames or ():
        try:
            out.append(Location(file=str(f.get("file", "")), line=int(f.get("line") or 0),
                                code=str(f.get("code") or ""), function=str(f.get("function") or "")))
        except (TypeError, ValueError, AttributeError):
            continue
    return tuple(out)


__all__ = ["Kind", "Phase", "Role", "Record", "CompiledFacts", "Descriptor", "Statistics", "Program",
           "INDUCTOR", "is_inductor", "complete", "RecordName", "record_name", "name_parts",
           "record_op", "legacy_to_dotted",
           "tensor_name", "split_tensor_name", "module_path", "module_class", "module_op",
           "param_grad_links", "Location", "locations_from_frames", "PARAM_GRAD_WORD",
           "API_PREFIXES", "MODULE_PREFIXES"]
