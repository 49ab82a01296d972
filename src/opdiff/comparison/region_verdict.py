"""A region blamed, in words and source lines: the first divergence of a region (`regions.py`).

    region in `model.layers.0.self_attn` (forward; target: `Functional.scaled_dot_product_attention`,
    `Tensor.reshape` at sdpa_attention.py:183-195; golden: `Tensor.__getitem__`, ... `Torch.matmul`,
    ... at modeling_llama.py:176-199): the two runs execute different ops here, judged as one
    through the tensors entering and leaving it: inputs agree (`query`, `key`, `value` of
    `Functional.scaled_dot_product_attention`: cosine 1, rel err 0), output does not (...)
    — local error in this region

The tensors entering the region are named by the arguments the region's ops read them as
(`arguments.argument_name`: SDPA's `query`, `key`, `value`), a parameter by its FQN, a gradient
entering a backward region as `grad_output`; without the dump's dataflow (a region judged at its
module call) by the name they were measured under. A result re-judged from its files names them
the same way, from the region's saved facts (`region_facts.py`). `Divergence.region` carries
both sides' ops, these inputs, and each side's source lines (`target_locations`,
`golden_locations`): what the console prints as `target: FILE:LINE` and `golden: FILE:FIRST-LAST`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from typing_extensions import TypedDict

from ..store.schema import RecordName, module_path
from . import reasons
from .arguments import argument_name
from .regions import (SHOWN_OPS, ListedOp, Region, RegionOps, SourceLine, another_function_words,
                      made_tensor)
from .result import Divergence, Origin, TensorRow

if TYPE_CHECKING:
    from .blame import OpScore


class Entering(TypedDict):
    """A tensor entering a region, as its verdict names it (`boundary_inputs`)."""
    tensor: str
    name: str
    op: Optional[str]
    agrees: bool

SHOWN_INPUTS = 8        # boundary inputs named in a reason
SHOWN_LINES = 12        # source lines kept per side


def region_divergence(first: OpScore, rows: list[TensorRow]) -> Divergence:
    """The Divergence of a region blamed (`blame.first_divergence`)."""
    assert first.region is not None
    region, listed = first.region.region, first.region.listed
    out = rows[first.worst_out] if first.worst_out is not None else None
    inp = rows[first.worst_in] if first.worst_in is not None else None
    entering = boundary_inputs(first, rows)
    why = reasons.describe(first, rows, input_words(entering))
    other = another_function_words(first, rows)
    return Divergence(
        name=first.name, op=first.op, phase=first.phase,
        reason=region_reason(region, listed, why) + (f"; {other}" if other else ""),
        location=first.location, metrics=dict(out.metrics) if out is not None else {},
        tensor=made_tensor(first, out.target_name) if out is not None else None,
        input_metrics=dict(inp.metrics) if inp is not None else {}, module=first.module,
        context=reasons.source_context(first.location), kind=first.blame, origin=Origin.REGION,
        region={"target_ops": listed.target_ops, "golden_ops": listed.golden_ops,
                "inputs": entering,
                "target_locations": side_locations(listed.target_ops, region.where),
                "golden_locations": side_locations(listed.golden_ops, region.where)})


def boundary_inputs(first: OpScore, rows: list[TensorRow]) -> list[Entering]:
    """[{"tensor", "name", "op", "agrees"}] of the tensors a region's score was judged from as
    its inputs, in the order its ops read them: `name` what the user calls it (`query`; a
    parameter's FQN; the measured tensor's name where the reader is not known), `op` the op of
    the region that reads it (None where `name` says it all), `agrees` within its tolerance."""
    listed = first.region.listed if first.region is not None else RegionOps()
    out: list[Entering] = []
    for i, *_ in first.inputs:
        row = rows[i]
        tensor = row.target_name or ""
        reader = listed.readers.get(tensor)
        name, op = _measured(tensor)
        if reader is not None:
            op, key, fqn = reader
            if fqn:
                name, op = fqn, None
            elif key.startswith(("grad_output", "output")):   # (a backward region's)
                name = key
            else:
                name = argument_name(op, key) or f"input.{key}"
        out.append({"tensor": tensor, "name": name, "op": op,
                    "agrees": row.accuracy_reached != "No"})
    return out


def _measured(tensor: str) -> tuple[str, Optional[str]]:
    """(name, op) of a tensor known only by the name it was measured under: a module call's
    input by its argument (`hidden_states`, `input.0`) of that call, its parameter by its FQN;
    any other tensor by its whole name."""
    for marker in (".input.", ".parameters."):
        call, found, key = tensor.partition(marker)
        parsed = RecordName.parse(call) if found and tensor.startswith("Module.") else None
        if parsed is None or not key:
            continue
        if marker == ".parameters.":
            return f"{module_path(parsed.op)}.{key}".lstrip("."), None
        return (key if not key[0].isdigit() else f"input.{key}"), call
    return tensor, None


def input_words(inputs: list[Entering]) -> str:
    """"`query`, `key`, `value` of `Functional.scaled_dot_product_attention`"; where some are
    beyond their own tolerance (a bf16 run's q and k, which the region's verdict weighs against
    its output's error), "..., of which `query`, `key` exceed their own tolerance"."""
    differ = [f"`{i['name']}`" for i in inputs if not i["agrees"]]
    if not differ:
        return _listed(inputs)
    which = ", ".join(differ[:SHOWN_INPUTS]) + (", ..." if len(differ) > SHOWN_INPUTS else "")
    verb = "exceeds its" if len(differ) == 1 else "exceed their"
    return f"{_listed(inputs)}, of which {which} {verb} own tolerance"


def _listed(inputs: list[Entering]) -> str:
    groups: list[tuple[Optional[str], list[str]]] = []
    for item in inputs[:SHOWN_INPUTS]:
        if groups and item["op"] is not None and groups[-1][0] == item["op"]:
            groups[-1][1].append(item["name"])
        else:
            groups.append((item["op"], [item["name"]]))
    text = "; ".join(", ".join(f"`{n}`" for n in names) + (f" of `{op}`" if op else "")
                     for op, names in groups)
    return text + (", ..." if len(inputs) > SHOWN_INPUTS else "")


def side_locations(ops: list[ListedOp], where: str) -> list[SourceLine]:
    """A side's source lines, [{"file", "line", "code"}]: those of its ops that ran inside the
    region's module (all of them when none did), each line once, grouped by file in the order
    the files are first met, in line order within a file; at most SHOWN_LINES."""
    _, own = _inside_first(ops, where)
    by_file: dict[str, dict[int, str]] = {}
    for o in own:
        loc = o.get("location")
        if loc is not None and isinstance(loc.get("file"), str) and \
                isinstance(loc.get("line"), int):
            by_file.setdefault(loc["file"], {}).setdefault(loc["line"], loc.get("code"))
    out: list[SourceLine] = [{"file": file, "line": line, "code": lines[line]}
                             for file, lines in by_file.items() for line in sorted(lines)]
    return out[:SHOWN_LINES]


def region_reason(region: Region, ops: RegionOps, why: str) -> str:
    """The sentence of a region blamed: where, both sides' ops and lines, and why
    (`reasons.describe`)."""
    where = f" in `{region.where}`" if region.where else ""
    why = why.replace("local error in this op", "local error in this region")
    if "in this region" not in why:
        why += " — local error in this region"
    target, _ = _inside_first(ops.target_ops, region.where)
    golden, _ = _inside_first(ops.golden_ops, region.where)
    # (a one-sided region, `region_onesided.py`: one run executes ops the other has no twin of)
    runs = "the two runs execute different ops here" if target and golden else \
        f"only the {'target' if target else 'golden'} run executes ops here"
    return (f"region{where} ({region.phase}; target: {shown(target) or 'no op'}"
            f"{_lines(side_locations(ops.target_ops, region.where))}; golden: "
            f"{shown(golden) or 'no op'}{_lines(side_locations(ops.golden_ops, region.where))}): "
            f"{runs}, judged as one through the tensors entering and leaving it: "
            f"{why}{_unpaired(region)}{_through(region)}")


def shown(ops: list[ListedOp]) -> str:
    """`Torch.matmul`, `Functional.softmax`, ... (the first few distinct ops, in order)."""
    names = list(dict.fromkeys(f"`{o['op']}`" for o in ops))
    return ", ".join(names[:SHOWN_OPS]) + (", ..." if len(names) > SHOWN_OPS else "")


def _inside_first(ops: list[ListedOp], where: str) -> tuple[list[ListedOp], list[ListedOp]]:
    """(ops run inside the module at `where`, then the others; the inside ones alone): what a
    reason lists first is the region's own computation, not the ops outside that joined it
    because they feed only it (eager attention's mask, built in `LlamaModel`)."""
    def inside(o: ListedOp) -> bool:
        parsed = RecordName.parse(o.get("module") or "")
        path = module_path(parsed.op) if parsed is not None else ""
        return not where or path == where or path.startswith(where + ".")
    own = [o for o in ops if inside(o)]
    if not own:
        return ops, ops
    return own + [o for o in ops if not inside(o)], own


def _unpaired(region: Region) -> str:
    """What the verdict of a region whose parameters have no golden partner could not see."""
    if not region.unpaired_leaves:
        return ""
    names = ", ".join(f"`{n}`" for n in region.unpaired_leaves[:SHOWN_OPS])
    more = ", ..." if len(region.unpaired_leaves) > SHOWN_OPS else ""
    return (f" (its parameters {names}{more} have no partner in golden, which holds them in "
            f"other shapes, and were not compared: a difference in them would show the same way)")


def _through(region: Region) -> str:
    """What the verdict of a region judged from what its inputs were made of could not see
    (`region_boundaries`, upstream)."""
    if not region.through:
        return ""
    names = ", ".join(f"`{n}`" for n in region.through[:SHOWN_OPS])
    more = ", ..." if len(region.through) > SHOWN_OPS else ""
    return (f" (tensors it reads that no op compared, made by other regions' {names}{more}, "
            f"were judged from what those ops made them of: a difference those ops made in them "
            f"alone would show the same way)")


def _lines(located: list[SourceLine]) -> str:
    """" at modeling_llama.py:176-199" (`side_locations`'s first file; "and elsewhere" when
    there are others)."""
    if not located:
        return ""
    file = located[0]["file"]
    lines = [loc["line"] for loc in located if loc["file"] == file]
    name = file.replace("\\", "/").rsplit("/", 1)[-1]
    span = f"{lines[0]}" + (f"-{lines[-1]}" if lines[-1] != lines[0] else "")
    more = " and elsewhere" if any(loc["file"] != file for loc in located) else ""
    return f" at {name}:{span}{more}"


def spans(located: Sequence[Mapping[str, object]]
          ) -> list[tuple[str, int, int, list[tuple[int, str]]]]:
    """(file, first line, last line, [(line, code)]) per file of `side_locations` (as
    summary.json holds them: checked): what the console prints as `golden: FILE:FIRST-LAST` and
    the lines under it."""
    out: dict[str, list[tuple[int, str]]] = {}
    for loc in located:
        file, line = (loc.get("file"), loc.get("line")) if isinstance(loc, Mapping) else (0, 0)
        if isinstance(file, str) and isinstance(line, int):
            out.setdefault(file, []).append((line, str(loc.get("code") or "")))
    return [(file, lines[0][0], lines[-1][0], lines) for file, lines in out.items()]


__all__ = ["region_divergence", "region_reason", "boundary_inputs", "input_words",
           "side_locations", "spans", "shown", "SHOWN_INPUTS", "SHOWN_LINES"]
