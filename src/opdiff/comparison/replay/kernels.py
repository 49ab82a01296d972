"""A compiled kernel replayed from its saved inputs: the aten ops it fuses, run as the small
program capture stored with it (`capture/kernel_programs.py`), in float64 and on the CPU in their
own dtypes, for `opdiff check` and, as one op of a region's chain, for compare (`run_program`).

    from opdiff.comparison.replay.kernels import kernel_tensors
    rep = kernel_tensors(record, dump.tensor)
    rep.reference, rep.outputs      # [(name, target, float64 result, own-dtype result)]

A record of kind `kernel` holds `"program": {"steps": [...], "outputs": [...]}`: each step an
aten op with arguments that are the kernel's inputs (`{"ref": "input", "index": i}`, the record's
i-th input), earlier steps' results (`{"ref": "step", "index": j}`) or constants (scalar
descriptors); each output names the record output it lands in. In the float64 run every floating
dtype the program names (a `_to_copy` to float32, a `full` of float32) is float64: the reference
is the kernel's FX subgraph computed exactly; the own-dtype run is the same ops as eager runs
them. The outputs the program does not name are not judged (Inductor's internal buffers).

A dump is untrusted, and so is a program in it: every op must pass `ops.replay_refusal` before
any runs, each call is rebuilt by `calls.rebuild_call` (constants through the same decoding and
string allow-list, each result checked against `--max-tensor-mb`), no random draws, and any
reference that is not an earlier step or a saved input refuses the whole program
("untrusted: ..."). A kernel without a program says why (`"unmapped"`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ... import ops
from .calls import NotReplayable, flat_tensors, read_once, rebuild_call
from .running import rng_guard, shielded
from .tensors import Replayed
from .calls import Load
from ...store.schema import Record, complete

MAX_STEPS = 400
_FLOATING = ("torch.float32", "torch.float16", "torch.bfloat16", "torch.float64",
             "float32", "float16", "bfloat16", "float64")


def _untrusted(what: str) -> NotReplayable:
    return NotReplayable(f"untrusted: the kernel's stored program {what}")


def _steps(record: Record) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """The program's steps and its (output index, step index) pairs, checked for shape (a
    refusal, before anything runs, for anything but a well-formed program of allowed ops)."""
    program: Any = record.get("program")     # (untrusted: each part is checked below)
    if program is None:
        raise NotReplayable("a kernel Inductor generated, recorded without its program "
                            "(an older dump)")
    if not isinstance(program, dict):
        raise _untrusted("is not a mapping")
    if "unmapped" in program:
        raise NotReplayable(f"its program is unknown: {str(program['unmapped'])[:160]}")
    steps, outputs = program.get("steps"), program.get("outputs")
    if not isinstance(steps, list) or not isinstance(outputs, list) or not outputs:
        raise _untrusted("has no list of steps and outputs")
    if len(steps) > MAX_STEPS:
        raise _untrusted(f"has more than {MAX_STEPS} steps")
    n_in, n_out = len(record["inputs"]), len(record["outputs"])
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("op"), str) \
                or not isinstance(step.get("args"), list) \
                or not isinstance(step.get("kwargs", {}), dict):
            raise _untrusted(f"has a malformed step {i}")
        refused = ops.replay_refusal(step["op"])
        if refused:
            raise NotReplayable(f"step {i}: {refused}")
        for arg in list(step["args"]) + list(step.get("kwargs", {}).values()):
            _check_refs(arg, i, n_in, f"step {i}")
        if "item" in step and not _index(step["item"], 8):
            raise _untrusted(f"has a malformed result index in step {i}")
    pairs = []
    for o in outputs:
        value = o.get("value") if isinstance(o, dict) else None
        out: Any = o.get("output") if isinstance(o, dict) else None
        if not _index(out, n_out) or not isinstance(value, dict) or value.get("ref") != "step" \
                or not _index(value.get("index"), len(steps)):
            raise _untrusted(f"has a malformed output ({str(o)[:60]})")
        pairs.append((out, value["index"]))
    return steps, pairs


def _index(v: Any, n: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n


def _check_refs(arg: Any, step: int, n_in: int, where: str, depth: int = 0) -> None:
    """A reference names a saved input or an earlier step; constants nest at most 4 deep."""
    if not isinstance(arg, dict) or depth > 4:
        raise _untrusted(f"has a malformed argument in {where}")
    ref = arg.get("ref")
    if ref is not None:
        if not _index(arg.get("index"), n_in if ref == "input" else step) \
                or ref not in ("input", "step"):
            raise _untrusted(f"refers to {str(arg)[:60]} in {where}, which is neither a saved "
                             f"input nor an earlier step")
    elif arg.get("type") in ("list", "tuple"):
        items = arg.get("items")
        if not isinstance(items, list):
            raise _untrusted(f"has a malformed list in {where}")
        for item in items:
            _check_refs(item, step, n_in, where, depth + 1)


def _descriptor(arg: dict[str, Any], cast: Optional[torch.dtype]) -> dict[str, Any]:
    """An argument as `rebuild_call` reads it: references become tensors under keys of their
    own (`in:i`, `step:j`); floating dtypes become float64 in the float64 run."""
    ref = arg.get("ref")
    if ref is not None:
        return {"type": "tensor", "key": f"{ref}:{arg['index']}"}
    if arg.get("type") in ("list", "tuple"):
        return {**arg, "items": [_descriptor(a, cast) for a in arg["items"]]}
    if cast is not None and arg.get("type") == "dtype" and arg.get("value") in _FLOATING:
        return {"type": "dtype", "value": str(cast)}
    return arg


def _run(record: Record, steps: list[dict[str, Any]], load: Load,
         cast: Optional[torch.dtype], wanted: set[int]) -> dict[int, torch.Tensor]:
    """Run the program; returns the results of the steps in `wanted`."""
    inputs = record["inputs"]
    values: dict[str, torch.Tensor] = {}

    def chain_load(key: str) -> Any:
        if key in values:
            return values[key]
        i = int(key.split(":", 1)[1])
        desc = inputs[i]
        saved = desc.get("key") if isinstance(desc, dict) else None
        if not saved or desc.get("type") != "tensor":
            raise NotReplayable(f"its input {i} was not saved")
        return load(saved)

    out = {}
    for i, step in enumerate(steps):
        call_record: dict[str, Any] = {"name": f"{record['name']}.step{i}", "op": step["op"],
                       "inputs": [_descriptor(a, cast) for a in step["args"]],
                       "kwargs": {str(k): _descriptor(a, cast)
                                  for k, a in step.get("kwargs", {}).items()}}
        call = rebuild_call(complete(call_record), chain_load, cast)   # (a record of a step)
        with shielded(), rng_guard() as rng, torch.no_grad():
            result = call.run()
        if rng["consumed"]:
            raise NotReplayable(f"step {i} ({step['op']}) draws random numbers")
        made = flat_tensors([result])
        if "item" in step:      # (one result of a multi-result op: `var_mean(x)[1]`)
            made = made[step["item"]:step["item"] + 1]
        if len(made) != 1:
            raise NotReplayable(f"step {i} ({step['op']}) makes {len(made)} tensors, not one")
        values[f"step:{i}"] = made[0].detach()
        if i in wanted:
            out[i] = values[f"step:{i}"]
    return out


def program_refusal(record: Record) -> Optional[str]:
    """Why a kernel record's program must not run (checked before anything runs), or None."""
    try:
        _steps(record)
    except NotReplayable as exc:
        return str(exc)
    return None


def run_program(record: Record, load: Load, cast: Optional[torch.dtype]
                ) -> dict[int, torch.Tensor]:
    """A kernel record's program run on `load`ed inputs (the saved ones, or a region chain's
    values under their keys): {output index: tensor} of the outputs it names, in float64
    (`cast`) or in its own dtypes (None). A region's chain replay runs a kernel this way."""
    steps, pairs = _steps(record)
    made = _run(record, steps, load, cast, {j for _, j in pairs})
    return {o: made[j] for o, j in pairs}


def kernel_tensors(record: Record, load: Load) -> Replayed:
    """Re-run a kernel record's program in float64 and in its own dtypes on the CPU; the
    target is each output the program names, as the dump saved it. Raises NotReplayable with
    the reason (a refusal of an untrusted program says "untrusted: ...")."""
    steps, pairs = _steps(record)
    load = read_once(load)
    wanted = {j for _, j in pairs}
    exact = _run(record, steps, load, torch.float64, wanted)
    reference = _run(record, steps, load, None, wanted)
    outs = record["outputs"]
    found = []
    for o, j in pairs:
        name = f"{record['name']}.output.{o}"
        key = outs[o].get("key") if isinstance(outs[o], dict) else None
        t = load(key) if key else None
        if not isinstance(t, torch.Tensor):
            raise NotReplayable(f"{name} was not saved (dump with task='tensor')")
        e, r = exact[j], reference[j]
        if tuple(t.shape) != tuple(e.shape) or t.dtype != r.dtype:
            raise NotReplayable(f"{name}: the program makes {r.dtype} {list(e.shape)}, the dump "
                                f"holds {t.dtype} {list(t.shape)}")
        found.append((name, t, e, r))
    return Replayed("CPU chain of its fused aten ops (own dtypes)", tuple(found))


__all__ = ["kernel_tensors", "program_refusal", "run_program"]
