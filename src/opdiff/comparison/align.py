"""Line up the op sequences of two dumps, so each target op meets its golden twin or nobody.

Names carry per-name call counters (`Functional.relu.3.forward`), so one extra relu on the target
side renames every later relu: names alone cannot pair the rest. The rule:

1. Identical name sequences (the usual case) pair one to one.
2. Otherwise module calls pair first, by name (path, class, phase and call count), in an order
   both sides agree on (`module_anchors`); between two paired module calls the two sequences
   are diffed (longest matching blocks, like `diff`) on a signature
   that ignores counters: op, phase, kind, enclosing module path and the shapes of every tensor.
3. Stretches that still differ (an op fused on one side, an extra cast, a changed shape) are
   diffed again on op, phase and kind only. Two ops whose shapes differ pair there only when the
   whole stretch runs the same ops on both sides (the same computation on other shapes), and
   not when `shape_flag` asks for equal shapes: where the sides run other ops (SDPA against
   eager attention) a same-named op of other shapes is another op, never its twin. What is
   left unpaired forms regions (`regions.py`) or is reported as unmatched.
4. Two neighbours that ran in the other order on one side (under autocast a module's
   `parameters_grad` record comes after `Functional.linear.N.backward` on one side and before
   it on the other: the diff keeps one of the two as a match and leaves the other unmatched on
   both sides) pair when they carry the same name and fine signature (tensors in any order:
   a `parameters_grad` record's gradients come in the order they were made) and sit within
   `SWAP_WINDOW` places of each other.

Nothing is ever paired by position alone: an unmatched op never shifts the pairing after it.

Forced pairs (`forced=`, the mapping file's `ops:` lines: `forced.py`) come before all this: each
pairs as it is, whatever its names and shapes, and stands as an anchor beside the module calls
(those that would cross one are dropped); the rest pairs between them as above.

Before all this, `same_classes` gives the target's records as alignment sees them where a module
class is renamed (`NpuAttention` against golden's `LlamaAttention` at the same path): the
module calls at a path pair by path, phase and call count when the tensors both calls hold have
the same shapes, and the target's class is then spelled as golden's wherever a name carries it
(the module call, the ops inside it, its `parameters_grad`). A mapping file is applied first
and wins (`mapping.py`).
"""
from __future__ import annotations

import bisect
import functools
from difflib import SequenceMatcher
from typing import Any, Literal, Optional, Sequence, cast

from ..store.records import iter_tensors
from ..store.schema import Kind, PARAM_GRAD_WORD, Record, RecordName, module_class
from ..store.schema import module_path as path_of

Pair = tuple[Optional[int], Optional[int]]   # (target index, golden index)
Pair2 = tuple[int, int]                       # ... both known
SWAP_WINDOW = 4         # how far apart (in the pair list) two swapped neighbours may end up


def module_path(record: Record) -> str:
    """The enclosing module call without its call counter (`Module.layer1.0.Block.forward`)."""
    return _without_index(record["module"] or "")


@functools.lru_cache(maxsize=4096)      # a model has few module calls; each is parsed once
def _without_index(name: str) -> str:
    parsed = RecordName.parse(name) if name else None
    return parsed.without_index if parsed is not None else name


def shapes(record: Record) -> tuple[Any, ...]:
    """(role, shape) of every tensor of a record, in order; an `out=` tensor the op overwrites
    without reading is not one of its inputs (Inductor calls `mm(a, b, out=buf)`, eager
    `mm(a, b)`)."""
    return tuple((role, tuple(desc.get("shape") or ())) for _, role, desc in iter_tensors(record)
                 if not desc.get("overwritten"))


def coarse_key(record: Record) -> tuple[Any, ...]:
    """What pairs two records when nothing finer does: op, phase and kind."""
    return (record["op"], record["phase"], record["kind"])


def fine_key(record: Record) -> tuple[Any, ...]:
    """What pairs two records first: op, phase, kind, enclosing module and tensor shapes."""
    return coarse_key(record) + (module_path(record), shapes(record))


def align(target: list[Record], golden: list[Record], *, shape_flag: bool = False,
          forced: Sequence[Pair2] = ()) -> list[Pair]:
    """Pairs (ti, gi) covering every record of both sides once, in target execution order;
    unmatched records come as (ti, None) or (None, gi) at their place in the sequence.
    forced: pairs made whatever the records hold, increasing on both sides (`forced.py`)."""
    fixed = set(forced)
    if [r["name"] for r in target] == [r["name"] for r in golden] and \
            all(ti == gi for ti, gi in fixed):
        pairs: list[Pair] = []
        for i, (t, g) in enumerate(zip(target, golden)):
            if shape_flag and shapes(t) != shapes(g) and (i, i) not in fixed:
                pairs += [(i, None), (None, i)]
            else:
                pairs.append((i, i))
        return pairs
    pairs = []
    i0 = j0 = 0
    anchors = _with_forced(module_anchors(target, golden), sorted(fixed))
    for ti, gi in anchors + [(len(target), len(golden))]:
        pairs += _align_stretch(target, golden, i0, ti, j0, gi, shape_flag)
        if ti < len(target):
            if shape_flag and shapes(target[ti]) != shapes(golden[gi]) and (ti, gi) not in fixed:
                pairs += [(ti, None), (None, gi)]
            else:
                pairs.append((ti, gi))
        i0, j0 = ti + 1, gi + 1
    return _pair_swapped(_prefer_same_names(pairs, target, golden, fixed), target, golden)


def _with_forced(anchors: list[Pair2], forced: list[Pair2]) -> list[Pair2]:
    """The forced pairs and the module anchors that keep the order of both on both sides
    (between the same two forced pairs, on neither's records), by target order."""
    if not forced:
        return anchors
    t_at, g_at = [t for t, _ in forced], [g for _, g in forced]
    t_taken, g_taken = set(t_at), set(g_at)
    kept = [(ti, gi) for ti, gi in anchors
            if bisect.bisect_left(t_at, ti) == bisect.bisect_left(g_at, gi)
            and ti not in t_taken and gi not in g_taken]
    return sorted(kept + forced)


def same_classes(target: list[Record], golden: list[Record]
                 ) -> tuple[list[Record], dict[str, str]]:
    """(target records with each renamed class spelled as golden's, {target module op: golden
    module op} of those renamed): a module path whose class differs on the two sides is renamed
    when every call of it that both sides made (same phase and call count) holds tensors of the
    same shapes wherever both hold one, and at least one such tensor. Two different modules at
    one path (a `Linear` where golden has a `Conv1d` of other shapes) stay apart. The records
    themselves are not changed; with nothing renamed, `target` itself comes back."""
    t_ops, g_ops = _module_calls(target), _module_calls(golden)
    renames: dict[str, str] = {}
    for path, (t_op, t_calls) in t_ops.items():
        g_op, g_calls = g_ops.get(path, (t_op, {}))
        if g_op == t_op or not g_calls:
            continue
        both = [(t_calls[k], g_calls[k]) for k in t_calls if k in g_calls]
        if both and all(_same_shapes(target[i], golden[j]) for i, j in both):
            renames[t_op] = g_op
    if not renames:
        return target, {}
    seen: dict[str, str] = {}
    return [_spelled(rec, renames, seen) for rec in target], renames


def classes_note(renames: dict[str, str]) -> Optional[str]:
    """What `same_classes` paired, in a line: "module classes paired by path: target
    `NpuAttention` as golden's `LlamaAttention` (model.layers.0.self_attn, ...)"."""
    if not renames:
        return None
    by_class: dict[tuple[str, str], list[str]] = {}
    for t_op, g_op in renames.items():
        by_class.setdefault((module_class(t_op), module_class(g_op)), []).append(path_of(t_op))
    said = "; ".join(f"target `{t}` as golden's `{g}` ({', '.join(paths[:3])}"
                     f"{', ...' if len(paths) > 3 else ''})" for (t, g), paths in by_class.items())
    return f"module classes paired by path, call count and shapes: {said}; --map decides otherwise"


def _module_calls(records: list[Record]) -> dict[str, tuple[str, dict[tuple[str, int], int]]]:
    """module path -> (its module op, {(phase, call count): record index}); a path whose
    records name two classes (not one module) is left out."""
    out: dict[str, tuple[str, dict[tuple[str, int], int]]] = {}
    mixed: set[str] = set()
    for i, rec in enumerate(records):
        if rec["kind"] != Kind.MODULE:
            continue
        parsed = RecordName.parse(rec["name"])
        if parsed is None or not module_class(parsed.op):
            continue
        path = path_of(parsed.op)
        op, calls = out.setdefault(path, (parsed.op, {}))
        if op != parsed.op:
            mixed.add(path)
        calls[(parsed.phase, parsed.index)] = i
    return {p: v for p, v in out.items() if p not in mixed}


def _same_shapes(t: Record, g: Record) -> bool:
    """Both module calls hold a tensor in one place at least, and every tensor both hold has
    the same shape on both sides."""
    cut_t, cut_g = len(t["name"]), len(g["name"])
    g_shapes = {n[cut_g:]: tuple(d.get("shape") or ()) for n, _, d in iter_tensors(g)}
    common = 0
    for n, _, d in iter_tensors(t):
        shape = g_shapes.get(n[cut_t:])
        if shape is None:
            continue
        if shape != tuple(d.get("shape") or ()):
            return False
        common += 1
    return common > 0


_SPELLED: tuple[Literal["name", "op", "module", "reader", "forward"], ...] = (
    "name", "op", "module", "reader", "forward")


def _spelled(record: Record, renames: dict[str, str], seen: dict[str, str]) -> Record:
    """The record with every name that carries a renamed module op spelled with golden's."""
    changed: Optional[Record] = None
    for f in _SPELLED:
        value = record.get(f)
        if not isinstance(value, str) or not value.startswith("Module."):
            continue
        new = seen.get(value)
        if new is None:
            new = seen[value] = _respelled(value, renames)
        if new != value:
            changed = changed if changed is not None else record.copy()
            changed[f] = new
    return changed if changed is not None else record


def _respelled(value: str, renames: dict[str, str]) -> str:
    """`Module.attn.NpuAttention.forward.0` -> `Module.attn.LlamaAttention.forward.0` (a record
    name or a module op, `parameters_grad` ones too; anything else as it is)."""
    parsed = RecordName.parse(value)
    if parsed is not None and parsed.kind in (Kind.MODULE, Kind.PARAM_GRAD) \
            and parsed.op in renames:
        return RecordName(renames[parsed.op], parsed.phase, parsed.index, parsed.kind).text
    op, _, word = value.rpartition(".")
    if value in renames:
        return renames[value]
    if op in renames and word == PARAM_GRAD_WORD:
        return f"{renames[op]}.{word}"
    return value


def module_anchors(target: list[Record], golden: list[Record]) -> list[Pair2]:
    """The module calls both sides recorded (same path, class, phase and call count), in an
    order both agree on (the longest such chain): the first level of the alignment. Ops pair
    only between the same two anchors, so the diff runs on short stretches (one module call's
    ops: linear in the number of records where one diff of everything is quadratic) and never
    pairs an op across a module boundary."""
    t_mods = [(i, r["name"]) for i, r in enumerate(target) if r["kind"] == Kind.MODULE]
    g_mods = [(j, r["name"]) for j, r in enumerate(golden) if r["kind"] == Kind.MODULE]
    best: list[Pair2] = []
    # A wrapper module on one side (DDP's `module.`, a compile or FSDP wrapper) puts one more
    # part in front of every path there: try each side without its first part too.
    for t_key, g_key in ((_same, _same), (_unwrapped, _same), (_same, _unwrapped)):
        golden_at = {g_key(n): j for j, n in g_mods}
        both = [(i, golden_at[t_key(n)]) for i, n in t_mods if t_key(n) in golden_at]
        if len(both) > len(best):
            best = _increasing(both)
        if len(best) * 2 >= max(len(t_mods), len(g_mods)):
            break
    return best


def _same(name: str) -> str:
    return name


def _unwrapped(name: str) -> str:
    """`Module.module.model.fc.Linear.forward.0` -> `Module.model.fc.Linear.forward.0` (the
    module call as the run without the wrapper names it)."""
    parts = name.split(".")
    return ".".join(parts[:1] + parts[2:]) if len(parts) > 4 else name


def _increasing(pairs: list[Pair2]) -> list[Pair2]:
    """The longest run of `pairs` (increasing in the first) increasing in the second too
    (patience sorting, n log n)."""
    tails: list[int] = []          # golden index ending the best chain of each length
    ends: list[int] = []           # ... its position in `pairs`
    back: list[int] = [-1] * len(pairs)
    for k, (_, gi) in enumerate(pairs):
        at = bisect.bisect_left(tails, gi)
        if at == len(tails):
            tails.append(gi)
            ends.append(k)
        else:
            tails[at], ends[at] = gi, k
        back[k] = ends[at - 1] if at else -1
    chain: list[Pair2] = []
    k = ends[-1] if ends else -1
    while k >= 0:
        chain.append(pairs[k])
        k = back[k]
    return chain[::-1]


def _align_stretch(target: list[Record], golden: list[Record], i1: int, i2: int, j1: int,
                   j2: int, shape_flag: bool) -> list[Pair]:
    """Pairs of target[i1:i2] and golden[j1:j2]: diffed on fine keys, then the gaps on coarse."""
    if i1 == i2 or j1 == j2:
        return [(i, None) for i in range(i1, i2)] + [(None, j) for j in range(j1, j2)]
    tk = [fine_key(target[i]) for i in range(i1, i2)]
    gk = [fine_key(golden[j]) for j in range(j1, j2)]
    pairs: list[Pair] = []
    for tag, a1, a2, b1, b2 in _opcodes(tk, gk):
        if tag == "equal":
            pairs += [(i1 + a1 + k, j1 + b1 + k) for k in range(a2 - a1)]
        else:
            pairs += _align_gap(target, golden, i1 + a1, i1 + a2, j1 + b1, j1 + b2, shape_flag)
    return pairs


def _swap_key(record: Record) -> tuple[Any, ...]:
    """The fine signature with its tensors in any order (a `parameters_grad` record lists the
    weight's and the bias's gradient in the order they were produced; its tensors pair by name)."""
    return coarse_key(record) + (module_path(record), tuple(sorted(shapes(record))))


def _pair_swapped(pairs: list[Pair], target: list[Record], golden: list[Record]) -> list[Pair]:
    """Pair a target-only and a golden-only record a few places apart that carry the same name
    and fine signature (two neighbours that ran in the other order on one side); the pair
    takes the target record's place."""
    out: list[Optional[Pair]] = list(pairs)
    for k, pair in enumerate(out):
        if pair is None or pair[1] is not None or pair[0] is None:
            continue
        t = target[pair[0]]
        for m in range(max(0, k - SWAP_WINDOW), min(len(out), k + SWAP_WINDOW + 1)):
            other = out[m]
            if other is None or other[0] is not None or other[1] is None:
                continue
            g = golden[other[1]]
            if t["name"] == g["name"] and _swap_key(t) == _swap_key(g):
                out[k], out[m] = (pair[0], other[1]), None
                break
    return [pair for pair in out if pair is not None]


def _prefer_same_names(pairs: list[Pair], target: list[Record], golden: list[Record],
                       fixed: set[Pair2]) -> list[Pair]:
    """Where the diff could have put an unmatched op in several places (relu, relu), put it where
    the names agree: slide the gap forward while the op after it has the gap op's name (never
    past a forced pair, in `fixed`)."""
    out = list(pairs)
    for k in range(len(out) - 1):
        a, b = out[k], out[k + 1]
        if b in fixed:
            continue
        if a[1] is None and b[0] is not None and b[1] is not None:       # target-only op
            i, (i2, j) = cast(int, a[0]), cast(Pair2, b)
            if target[i]["name"] == golden[j]["name"] and \
                    coarse_key(target[i]) == coarse_key(target[i2]):
                out[k], out[k + 1] = (i, j), (i2, None)
        elif a[0] is None and b[0] is not None and b[1] is not None:     # golden-only op
            j, (i, j2) = cast(int, a[1]), cast(Pair2, b)
            if golden[j]["name"] == target[i]["name"] and \
                    coarse_key(golden[j]) == coarse_key(golden[j2]):
                out[k], out[k + 1] = (i, j), (None, j2)
    return out


def _opcodes(a: list[Any], b: list[Any]) -> Sequence[tuple[str, int, int, int, int]]:
    # Intern keys to small ints: hashing tuples of shapes once is much cheaper than in the matcher.
    table: dict[Any, int] = {}
    ia = [table.setdefault(k, len(table)) for k in a]
    ib = [table.setdefault(k, len(table)) for k in b]
    return SequenceMatcher(None, ia, ib, autojunk=False).get_opcodes()


def _align_gap(target: list[Record], golden: list[Record], i1: int, i2: int, j1: int, j2: int,
               shape_flag: bool) -> list[Pair]:
    """Pair what can be paired inside a stretch where the fine signatures differ."""
    pairs: list[Pair] = []
    if i1 == i2 or j1 == j2:
        return [(i, None) for i in range(i1, i2)] + [(None, j) for j in range(j1, j2)]
    tk = [coarse_key(target[i]) for i in range(i1, i2)]
    gk = [coarse_key(golden[j]) for j in range(j1, j2)]
    same_ops = tk == gk
    for tag, a1, a2, b1, b2 in _opcodes(tk, gk):
        if tag == "equal" and not shape_flag:
            for k in range(a2 - a1):
                ti, gi = i1 + a1 + k, j1 + b1 + k
                if same_ops or shapes(target[ti]) == shapes(golden[gi]):
                    pairs.append((ti, gi))
                else:
                    pairs += [(ti, None), (None, gi)]
        else:
            pairs += [(i1 + k, None) for k in range(a1, a2)]
            pairs += [(None, j1 + k) for k in range(b1, b2)]
    return pairs
