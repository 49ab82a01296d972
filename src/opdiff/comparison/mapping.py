"""The mapping file (`--map pairs.yaml`): what dataflow cannot infer, said by the user.

    modules:                      # target name: golden name (module paths or path segments)
      npu_attn: self_attn         #   a segment: renamed wherever it stands in a path
      model.layers.0.npu_mlp: model.layers.0.mlp    # a path: renamed where it stands whole
    ignore:                       # op names or fnmatch patterns dropped before alignment
      - Tensor.contiguous         #   on both sides
      - target: [NPU.npu_format_cast]   # or on one side only (target: / golden:)
    concat:                       # one fused target module: golden modules it concatenates
      qkv_proj: [q_proj, k_proj, v_proj]                   #   along the last dim
      gate_up_proj: {golden: [gate_proj, up_proj], dim: -1}
    ops:                          # target op call[.tensor]: golden op call[.tensor], forced pairs
      Functional.scaled_dot_product_attention.0.forward.output.0: Torch.matmul.1.forward.output.0

msprobe's `cell_mapping.yaml` (`ClassOrSegment: ClassOrSegment`, `fc2.Dense: fc2.Linear`) and
`data_mapping.yaml` are read as they are and become the same rules: module names
(`Module.<path>.<Class>.forward.0[.output.0]`) become path renames, bare names segment renames,
and `name.Class` a rename of the name and of the class; a `data_mapping.yaml`'s op lines
(`NPU.npu_fusion_attention.4.forward.input.0: ...`, with or without the tensor) are `ops:` lines,
and its `N/A` partners (what msprobe writes for "no partner") are left out. What `concat:` does
is `concat.py`'s; what `ops:` does (forced pairs, their tensor lists) is `forced.py`'s.

`load` parses and checks the file's shape (a YAML error or a malformed line: `MappingError`
naming the file and line). `Mapping.bind` checks it against one pair of dumps (a name that
matches nothing in either: `MappingError`) and gives the target records as alignment sees them
(renamed), both sides without ignored records, golden with `concat:` parts joined, and the
lines it never used, and the forced pairs of `ops:` lines.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Optional, TYPE_CHECKING

from ..errors import OpdiffError
from ..store.schema import Kind, Record, RecordName, split_tensor_name
from .forced import ForcedPair, resolve

if TYPE_CHECKING:
    from ..store.source import DumpSource

SECTIONS = ("modules", "ignore", "concat", "ops")
NO_PARTNER = "N/A"          # msprobe's data_mapping.yaml: a tensor without a partner
SIDES = ("both", "target", "golden")
_OP_PREFIXES = ("Functional.", "Torch.", "Tensor.", "Aten.", "NPU.", "Distributed.", "Jit.",
                "Mint.", "Primitive.", "MintFunctional.", "VF.", "Parameter.", "Input.")
_MODULE_PREFIXES = ("Module.", "Cell.")
_RENAMED_FIELDS: tuple[Literal["name", "op", "module", "reader"], ...] = ("name", "op", "module", "reader")


class MappingError(OpdiffError):
    """A mapping file (`--map`) that cannot be read or names something no dump holds."""


@dataclass(frozen=True)
class Rule:
    """One line of the file: a rename (`kind` "module", `old` -> `new`: dotted parts, renamed as
    one segment or one contiguous path), an ignore (`kind` "ignore", `old` a pattern, `side`),
    a concatenation (`kind` "concat": the fused target module `old`, golden's `parts`, `dim`) or
    a forced pair (`kind` "op": target record `old`, golden record `new`, `parts` the two
    tensor suffixes, `(".output.0", ".output.0")`, or () for the whole records)."""
    kind: str
    old: str
    new: str
    line: int
    side: str = "both"
    parts: tuple[str, ...] = ()
    dim: int = -1

    @property
    def text(self) -> str:
        if self.kind == "concat":
            return f"concat {self.old}: [{', '.join(self.parts)}] dim {self.dim}"
        if self.kind == "op":
            t, g = self.parts or ("", "")
            return f"{self.old}{t}: {self.new}{g}"
        return f"{self.old}: {self.new}" if self.kind == "module" else f"ignore {self.old}"


@dataclass(frozen=True)
class Mapping:
    """A parsed mapping file: small, frozen and picklable (the worker pool sends it along)."""
    path: str
    rules: tuple[Rule, ...] = ()

    def where(self, rule: Rule) -> str:
        return f"{self.path}:{rule.line}"

    def bind(self, target: list[Record], golden: list[Record]) -> "Bound":
        """Check every rule against this pair of dumps and apply it (see `Bound`)."""
        t_names, g_names = _names(target), _names(golden)
        for rule in self.rules:
            if rule.kind in ("concat", "op"):
                continue            # checked where they are applied
            sides = ((rule.old, t_names | g_names),) if rule.kind == "ignore" else \
                ((rule.old, t_names | g_names), (rule.new, t_names | g_names))
            for name, names in sides:
                if not any(_matches(rule, name, n) for n in names):
                    raise MappingError(f"{self.where(rule)}: {name!r} matches nothing in either "
                                       f"dump; check the spelling against the report's names")
        used: set[int] = set()
        renames = [r for r in self.rules if r.kind == "module" and r.old != r.new]
        seen: dict[str, str] = {}       # module paths repeat on every op: rename each once
        view = [_renamed(rec, renames, used, g_names, seen) for rec in target] if renames \
            else target
        keep_t = _kept(view, self.rules, "target", used)
        keep_g = _kept(golden, self.rules, "golden", used)
        from .concat import Joiner      # (it reads this module's Rule)

        joiner = Joiner(self, used)
        kept_view = [view[i] for i in keep_t]
        joined = joiner.join(kept_view, [golden[j] for j in keep_g])
        ops = [r for r in self.rules if r.kind == "op"]
        forced = resolve(self, ops, target, [target[i] for i in keep_t], golden, joined) \
            if ops else ()
        used.update(r.line for r in ops)        # (every line resolved forces its pair)
        first = {r.line: r for r in reversed(self.rules)}      # a line's first rule names it
        unused = tuple(f"mapping {self.where(r)} ({r.text}) was never used: nothing it names "
                       f"changed the pairing" for line, r in sorted(first.items())
                       if line not in used)
        return Bound(view=kept_view, target_index=tuple(keep_t), golden_index=tuple(keep_g),
                     unused=unused, golden=joined, notes=tuple(joiner.notes.values()),
                     joined_keys=joiner.keys, forced=forced)


@dataclass
class Bound:
    """A mapping applied to one pair of dumps: `view` the kept target records as alignment sees
    them (renamed), `target_index`/`golden_index` where each kept record sits in its dump,
    `unused` one note per line that changed nothing, `golden` the kept golden records with the
    parts of each `concat:` line joined into one record, `notes` what a join left out,
    `joined_keys` the tensors `golden_source` concatenates when loaded, and `forced` the pairs
    of `ops:` lines (indices into `view` and `golden`, by target order)."""
    view: list[Record]
    target_index: tuple[int, ...]
    golden_index: tuple[int, ...]
    unused: tuple[str, ...] = field(default=())
    golden: list[Record] = field(default_factory=list)
    notes: tuple[str, ...] = field(default=())
    joined_keys: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    forced: tuple[ForcedPair, ...] = field(default=())

    def golden_source(self, dump: "DumpSource") -> "DumpSource":
        """The golden dump, loading the joined records' tensors as their parts concatenated."""
        if not self.joined_keys:
            return dump
        from .concat import JoinedSource

        return JoinedSource(dump, self.joined_keys)


MAX_MAPPING_BYTES = 16 << 20


def load(path: str | os.PathLike[str]) -> Mapping:
    """Parse a mapping file (ours or msprobe's); `MappingError` names the file and line."""
    import yaml       # PyYAML (a core dependency)

    from ..store import dumpfiles

    where = os.fspath(path)
    try:    # a regular file only, read without waiting: a FIFO or /dev/zero is refused
        text = dumpfiles.read_text(path, MAX_MAPPING_BYTES)
    except dumpfiles.UnreadableText as e:
        if e.too_large:
            raise MappingError(f"{where}: {e.problem}; a mapping file names ops, it is never "
                               f"that large") from None
        raise MappingError(f"{where}: cannot read the mapping file ({e.problem}); pass a UTF-8 "
                           f"YAML file to --map") from None
    try:
        _check_depth(where, yaml.parse(text, Loader=yaml.SafeLoader))
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise MappingError(f"{where}{line}: not valid YAML ({problem})") from None
    if root is None:
        return Mapping(where)
    if not isinstance(root, yaml.MappingNode):
        raise MappingError(f"{where}:{_line(root)}: expected sections such as 'modules:' and "
                           f"'ignore:', or msprobe's 'name: name' lines")
    keys = [k.value for k, _ in root.value if isinstance(k, yaml.ScalarNode)]
    if any(k in SECTIONS for k in keys):
        rules = _ours(where, root)
    else:
        rules = [r for k, v in root.value for r in _msprobe(where, k, v)]
    return Mapping(where, tuple(rules))


MAX_DEPTH = 100      # a mapping file nests about 4 deep; the composer recurses once a level


def _check_depth(where: str, events: Any) -> None:
    """Refuse a file nested deeper than MAX_DEPTH (read event by event, before anything
    recurses over it: a 50,000-deep file would end in RecursionError)."""
    import yaml

    depth = 0
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise MappingError(f"{where}:{event.start_mark.line + 1}: nested more than "
                                   f"{MAX_DEPTH} deep; a mapping file is a few levels of "
                                   f"'name: name' lines")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _line(node: Any) -> int:
    return int(node.start_mark.line) + 1


def _scalar(where: str, node: Any) -> str:
    import yaml
    if not isinstance(node, yaml.ScalarNode) or not str(node.value).strip():
        raise MappingError(f"{where}:{_line(node)}: expected a name here")
    return str(node.value).strip()


def _ours(where: str, root: Any) -> list[Rule]:
    import yaml
    rules: list[Rule] = []
    for key, value in root.value:
        section = _scalar(where, key)
        if section not in SECTIONS:
            raise MappingError(f"{where}:{_line(key)}: unknown section {section!r}; use "
                               f"'modules:', 'ignore:', 'concat:' or 'ops:'")
        if section == "concat":
            rules += _concats(where, value)
        elif section == "ops":
            if not isinstance(value, yaml.MappingNode):
                raise MappingError(f"{where}:{_line(value)}: 'ops:' takes 'target_op_call: "
                                   f"golden_op_call' lines (Functional.x.0.forward[.output.0])")
            rules += [_op_pair(where, k, v) for k, v in value.value]
        elif section == "modules":
            if not isinstance(value, yaml.MappingNode):
                raise MappingError(f"{where}:{_line(value)}: 'modules:' takes 'target_name: "
                                   f"golden_name' lines")
            rules += [r for k, v in value.value for r in _rename(where, k, v)]
        else:
            rules += _ignores(where, value, "both")
    return rules


def _concats(where: str, node: Any) -> list[Rule]:
    """`concat:`'s lines: `fused: [part, part, ...]` (dim -1) or
    `fused: {golden: [part, ...], dim: N}`; names are module paths or path segments."""
    import yaml
    usage = ("'concat:' takes 'fused_target_module: [golden_module, golden_module, ...]' or "
             "'fused: {golden: [...], dim: N}' lines")
    if not isinstance(node, yaml.MappingNode):
        raise MappingError(f"{where}:{_line(node)}: {usage}")
    rules = []
    for key, value in node.value:
        fused, line, dim, parts_node = _scalar(where, key), _line(key), -1, value
        if isinstance(value, yaml.MappingNode):
            fields = {_scalar(where, k): v for k, v in value.value}
            extra = set(fields) - {"golden", "dim"}
            if extra or "golden" not in fields:
                raise MappingError(f"{where}:{_line(value)}: under {fused!r} give 'golden: "
                                   f"[...]' and optionally 'dim: N', not "
                                   f"{', '.join(sorted(extra)) or 'nothing'}")
            parts_node = fields["golden"]
            if "dim" in fields:
                text = _scalar(where, fields["dim"])
                try:
                    dim = int(text)
                except ValueError:
                    raise MappingError(f"{where}:{_line(fields['dim'])}: 'dim' takes a whole "
                                       f"number (-1: the last dim), not {text!r}") from None
        if not isinstance(parts_node, yaml.SequenceNode) or len(parts_node.value) < 2:
            raise MappingError(f"{where}:{_line(parts_node)}: {fused!r} takes a list of two or "
                               f"more golden modules ([q_proj, k_proj, v_proj]); {usage}")
        parts = tuple(_scalar(where, p) for p in parts_node.value)
        for name, at in [(fused, key)] + list(zip(parts, parts_node.value)):
            if name.startswith(_OP_PREFIXES + _MODULE_PREFIXES):
                raise MappingError(f"{where}:{_line(at)}: {name!r} is a record name; 'concat:' "
                                   f"takes module paths or path segments (qkv_proj, "
                                   f"model.layers.0.self_attn.qkv_proj)")
        rules.append(Rule("concat", fused, ", ".join(parts), line, parts=parts, dim=dim))
    return rules


def _ignores(where: str, node: Any, side: str, in_list: bool = False) -> list[Rule]:
    """`ignore:`'s names: a name, a list of names, or `target:`/`golden:` each with a name or a
    list; never a list in a list (YAML aliases could multiply those without end)."""
    import yaml
    if isinstance(node, yaml.ScalarNode):
        return [Rule("ignore", _scalar(where, node), "", _line(node), side)]
    if isinstance(node, yaml.SequenceNode) and not in_list:
        return [r for item in node.value for r in _ignores(where, item, side, True)]
    if isinstance(node, yaml.MappingNode) and side == "both":
        out: list[Rule] = []
        for k, v in node.value:
            which = _scalar(where, k)
            if which not in ("target", "golden"):
                raise MappingError(f"{where}:{_line(k)}: under 'ignore:' use a list of names, "
                                   f"or 'target:' / 'golden:' lists, not {which!r}")
            out += _ignores(where, v, which)
        return out
    raise MappingError(f"{where}:{_line(node)}: 'ignore:' takes a list of op names or patterns")


def _rename(where: str, key: Any, value: Any) -> list[Rule]:
    """A `target: golden` line: one path or segment rename, or, for two module record names
    (`Module.<path>.<Class>.forward.0`), a rename of the path and, where they differ, of the class."""
    old, new = _scalar(where, key), _scalar(where, value)
    (old_path, old_cls), (new_path, new_cls) = _module_part(where, key, old), \
        _module_part(where, value, new)
    if (old_cls is None) != (new_cls is None):
        raise MappingError(f"{where}:{_line(key)}: pair a module record name with another "
                           f"(Module.<path>.<Class>.forward.0), or a path with a path")
    rules = [Rule("module", old_path, new_path, _line(key))]
    if old_cls is not None and new_cls is not None and old_cls != new_cls:
        rules.append(Rule("module", old_cls, new_cls, _line(key)))
    return rules


def _module_part(where: str, node: Any, name: str) -> tuple[str, Optional[str]]:
    """`Module.model.attn.Attn.forward.0` -> (`model.attn`, `Attn`): the path and class of a
    module record name; a path or a segment stays as it is (class None)."""
    if name.startswith(_MODULE_PREFIXES):
        parts = name.split(".")
        for tail in ("input", "output", "parameters"):      # msprobe's `...forward.0.output.0`
            if tail in parts:
                parts = parts[:parts.index(tail)]
        while parts and (parts[-1].isdigit() or parts[-1] in ("forward", "backward")):
            parts.pop()
        if len(parts) < 3:
            raise MappingError(f"{where}:{_line(node)}: {name!r} names no module path; write "
                               f"Module.<path>.<Class>.forward.0")
        return ".".join(parts[1:-1]), parts[-1]
    if name.startswith(_OP_PREFIXES):
        raise MappingError(f"{where}:{_line(node)}: {name!r} names an op call; pair op calls "
                           f"under 'ops:' (Functional.x.0.forward[.output.0]: ...)")
    return name, None


def _op_pair(where: str, key: Any, value: Any) -> Rule:
    """An `ops:` line, or an op line of msprobe's data_mapping.yaml: two op call names
    (`Functional.x.0.forward`), each with or without a tensor (`.input.0`, `.output.0`)."""
    names, line = [], _line(key)
    for node in (key, value):
        text = _scalar(where, node)
        record, role, _ = split_tensor_name(text)
        parsed = RecordName.parse(record)
        if parsed is None or parsed.kind not in (Kind.API, Kind.ATEN) or record.startswith(
                _MODULE_PREFIXES):
            raise MappingError(f"{where}:{_line(node)}: {text!r} names no op call; write "
                               f"<Prefix>.<op>.<n>.<forward|backward>[.input.<i>|.output.<i>] "
                               f"(module calls are renamed under 'modules:')")
        names.append((record, text[len(record):] if role else ""))
    (old, t_suffix), (new, g_suffix) = names
    if bool(t_suffix) != bool(g_suffix):
        raise MappingError(f"{where}:{line}: name a tensor on both sides of ':' or on neither "
                           f"({old + t_suffix!r} against {new + g_suffix!r})")
    return Rule("op", old, new, line, parts=(t_suffix, g_suffix) if t_suffix else ())


def _msprobe(where: str, key: Any, value: Any) -> list[Rule]:
    """One line of msprobe's cell_mapping.yaml or data_mapping.yaml (target: golden). The
    `{module_name}.{class_name}` form (`fc2.Dense: fc2.Linear`) renames the module name wherever
    it stands (the modules and parameters under it, whose paths hold no class, pair too) and,
    where they differ, the class. Op lines (`Functional.x.0.forward.output.0: ...`) are forced
    pairs (`_op_pair`); a line whose partner is msprobe's `N/A` pairs nothing and is left out."""
    import yaml
    if isinstance(value, yaml.ScalarNode) and str(value.value).strip() == NO_PARTNER:
        return []
    if any(isinstance(n, yaml.ScalarNode) and str(n.value).strip().startswith(_OP_PREFIXES)
           for n in (key, value)):
        return [_op_pair(where, key, value)]
    rules = _rename(where, key, value)
    old, new = rules[0].old.rsplit(".", 1), rules[0].new.rsplit(".", 1)
    if len(rules) > 1 or len(old) < 2 or len(new) < 2 or not (old[1][:1].isupper()
                                                               and new[1][:1].isupper()):
        return rules
    split = [Rule("module", o, n, rules[0].line) for o, n in zip(old, new) if o != n]
    return split or rules


def _names(records: Iterable[Record]) -> set[str]:
    return {str(r[f]) for r in records for f in ("name", "op", "module") if r[f]}


def _matches(rule: Rule, pattern: str, name: str) -> bool:
    if rule.kind == "ignore":
        return fnmatch.fnmatchcase(name, pattern)
    return _find(name.split("."), pattern.split(".")) >= 0


def _find(parts: list[str], sub: list[str]) -> int:
    n = len(sub)
    for k in range(len(parts) - n + 1):
        if parts[k:k + n] == sub:
            return k
    return -1


def _rename_text(text: str, renames: list[Rule], used: set[int], golden: set[str]) -> str:
    """`text` with each rule's old parts replaced by its new ones, in one pass from the left: at
    each place the file's first rule that fits wins, and what it wrote is not renamed again (so
    `a: b` and `b: a` swap, never chain)."""
    parts, out, hits = text.split("."), [], []
    k = 0
    while k < len(parts):
        for rule in renames:
            old = rule.old.split(".")
            if parts[k:k + len(old)] == old:
                out += rule.new.split(".")
                hits.append(rule.line)
                k += len(old)
                break
        else:
            out.append(parts[k])
            k += 1
    renamed = ".".join(out)
    if hits and renamed != text and renamed in golden:     # it made a name the golden run has
        used.update(hits)
    return renamed


def _renamed(record: Record, renames: list[Rule], used: set[int], golden: set[str],
             seen: dict[str, str]) -> Record:
    changed: Optional[Record] = None
    for f in _RENAMED_FIELDS:
        value = record.get(f)
        if isinstance(value, str) and value:
            new = seen.get(value)
            if new is None:
                new = seen[value] = _rename_text(value, renames, used, golden)
            if new != value:
                changed = changed if changed is not None else record.copy()
                changed[f] = new
    return changed if changed is not None else record


def _kept(records: list[Record], rules: tuple[Rule, ...], side: str, used: set[int]) -> list[int]:
    drops = [r for r in rules if r.kind == "ignore" and r.side in ("both", side)]
    if not drops:
        return list(range(len(records)))
    keep: list[int] = []
    for i, rec in enumerate(records):
        hit = next((r for r in drops if any(fnmatch.fnmatchcase(rec[f], r.old)
                                            for f in ("name", "op"))), None)
        if hit is None:
            keep.append(i)
        else:
            used.add(hit.line)
    return keep
