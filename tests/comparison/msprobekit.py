"""Write a real run's opdiff dump again in msprobe's layout (statistics mode), as msprobe 26.2
writes it (compare tests/data/msprobe/statistics/, written by real msprobe):

    step0/rank0/dump.json        {"task", "level", "framework", "dump_data_dir", "data": {name: entry}}
    step0/rank0/stack.json       {"0": [[names...], ["File f, line n, in fn, \\n code", ...]]}
    step0/rank0/construct.json   {name: parent module call | null}; in backward the parent's
                                 backward call (`Module.fc.Linear.backward.0`)

What msprobe does not have is left out: no records of leaves (`Parameter.*`, `Input.*`), no
dataflow (`producer`), no nan/inf counts, statistics as Max/Min/Mean/Norm; a module's backward
entry comes after the backward of the ops inside it (msprobe's module backward hook fires when
the module's input gradients are done), not before them as opdiff records it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opdiff.store.adapters import discover
from opdiff.store.schema import Kind, Phase, RecordName

_DTYPES = {"float32": "torch.float32", "bfloat16": "torch.bfloat16", "float16": "torch.float16",
           "int64": "torch.int64", "bool": "torch.bool", "int32": "torch.int32",
           "float64": "torch.float64"}


def _arg(desc: Any) -> Any:
    """One opdiff descriptor as msprobe writes the argument."""
    if not isinstance(desc, dict):
        return None
    t = desc.get("type")
    if t == "tensor":
        stats = desc.get("stats") or {}
        return {"type": "torch.Tensor", "dtype": _DTYPES.get(desc.get("dtype"),
                                                             f"torch.{desc.get('dtype')}"),
                "shape": desc.get("shape"), "Max": stats.get("max"), "Min": stats.get("min"),
                "Mean": stats.get("mean"), "Norm": stats.get("norm"),
                "requires_grad": desc.get("requires_grad", False)}
    if t in ("int", "float", "bool", "str"):
        return {"type": t, "value": desc.get("value")}
    if t in ("list", "tuple"):
        return [_arg(d) for d in desc.get("items", [])]
    if t == "dict":
        return {k: _arg(d) for k, d in desc.get("items", {}).items()}
    if t in ("dtype", "device", "size"):
        return {"type": {"dtype": "torch.dtype", "device": "torch.device",
                         "size": "torch.Size"}[t], "value": desc.get("value")}
    if t == "none":
        return None
    return {"type": "str", "value": str(desc.get("value"))}


def _entry(rec: dict[str, Any]) -> dict[str, Any]:
    if rec.get("kind") == Kind.PARAM_GRAD:
        return {k: [_arg(d)] for k, d in (rec.get("parameters") or {}).items()}
    outputs = [_arg(d) for d in rec.get("outputs") or []]
    if rec.get("phase") == Phase.BACKWARD:
        return {"input": [_arg(d) for d in rec.get("inputs") or []], "output": outputs}
    entry = {"input_args": [_arg(d) for d in rec.get("inputs") or []],
             "input_kwargs": {k: _arg(d) for k, d in (rec.get("kwargs") or {}).items()},
             "output": outputs}
    if rec.get("parameters"):
        entry["parameters"] = {k: _arg(d) for k, d in rec["parameters"].items()}
    return entry


def _msprobe_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each module's backward record moved after the backward records of what it holds."""
    parents = {r["name"]: r.get("module") for r in records if r.get("kind") == Kind.MODULE}

    def inside(rec: dict[str, Any], call: str) -> bool:
        m = rec.get("module")
        if rec.get("kind") == Kind.PARAM_GRAD:         # `Module.x.L.parameters_grad.0`
            return call.startswith(str(rec.get("op")).rsplit(".", 1)[0] + ".forward.")
        while m:
            if m == call:
                return True
            m = parents.get(m)
        return False

    out = list(records)
    k = 0
    while k < len(out):
        rec = out[k]
        if rec.get("kind") == Kind.MODULE and rec.get("phase") == Phase.BACKWARD \
                and not rec.get("_moved"):
            call = str(rec.get("forward"))
            end = k + 1
            while end < len(out) and out[end].get("phase") == Phase.BACKWARD and \
                    inside(out[end], call):
                end += 1
            moved = dict(rec, _moved=True)
            out[k:end] = out[k + 1:end] + [moved]
            continue
        k += 1
    return [{k: v for k, v in r.items() if k != "_moved"} for r in out]


def _parent(rec: dict[str, Any]) -> Any:
    """construct.json's parent: in backward, msprobe names the module's backward call
    (`Functional.linear.0.backward -> Module.fc.Linear.backward.0`)."""
    parent = rec.get("module")
    if not parent or rec.get("phase") != Phase.BACKWARD:
        return parent
    parsed = RecordName.parse(parent)
    return parsed.with_phase(Phase.BACKWARD).text if parsed is not None else parent


def write_msprobe(opdiff_dump: Path, out: Path) -> Path:
    """`opdiff_dump` (one step, one rank) written again under `out` in msprobe's layout."""
    (dump,) = discover(opdiff_dump)
    records = [r for r in dump.records() if r.get("kind") != Kind.LEAF]
    records = _msprobe_order(records)
    rank = out / "step0" / "rank0"
    rank.mkdir(parents=True, exist_ok=True)
    data = {r["name"]: _entry(r) for r in records}
    (rank / "dump.json").write_text(json.dumps({
        "task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
        "data": data}))
    (rank / "construct.json").write_text(json.dumps({r["name"]: _parent(r) for r in records
                                                     if r.get("kind") != Kind.PARAM_GRAD}))
    stacks: dict[str, list[list[str]]] = {}
    by_id: dict[Any, str] = {}
    for r in records:
        sid = r.get("stack")
        if sid is None or r.get("phase") != Phase.FORWARD:
            continue        # msprobe keeps no stack for backward calls
        if sid not in by_id:
            by_id[sid] = str(len(stacks))
            frames = [f"File {f['file']}, line {f['line']}, in {f.get('function', '?')}, \n "
                      f"{f.get('code', '')}" for f in dump.stack(sid)]
            stacks[by_id[sid]] = [[], frames]
        stacks[by_id[sid]][0].append(r["name"])
    (rank / "stack.json").write_text(json.dumps(stacks))
    return out
