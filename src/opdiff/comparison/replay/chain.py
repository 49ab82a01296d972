"""Region replay: a region's target ops re-run as one chain from the region's saved inputs.

Where the two runs execute different ops (SDPA against eager attention's matmul, softmax,
matmul), the comparison judges the ops between paired tensors as one *region*
(`opdiff.comparison.regions`) through its boundary tensors. Its output error against golden then
mixes what the region made with what its inputs carried and with the dtype: a bf16 SDPA's
output differs from fp32 eager math by more than a 0.5% fault adds. With the target's tensors
saved, the region is judged on its own error as one replayed op is
(`opdiff.comparison.replay.local`):

    from opdiff.comparison.replay.chain import Readers, replay_region
    local = replay_region("Region.1.forward", members, Readers(records), dump.tensor, policy)
    local.culprit, local.describe()

- its target ops run in execution order, twice: once in float64, once on the CPU in their own
  dtypes (under CPU autocast where that is what reproduces an op's recorded output dtypes);
- each op's tensor inputs come from the chain (an input whose producer, `"producer": [seq,
  slot]` on its descriptor, is an earlier op of the region) or from the region's saved inputs
  (the tensor the target dump saved for it); an input that can be neither leaves the region
  "not replayed" with the reason, nothing is guessed;
- the region's outputs (the tensors its ops made that a recorded op outside it reads; without
  any, its last op's: `Readers.outputs`) are judged by the rules a replayed op's output is (`rules.settle`, then
  `rules.judge_tensor` with the own-dtype chain as the reference: what a correct chain of
  these dtypes makes).

Only what replay runs for one op runs here: ops on the allow-list (`ops.replay_refusal`, checked
for every op before any runs: a dump is untrusted), arguments rebuilt by `calls.rebuild_call`
(each call's result checked against `--max-tensor-mb`), no random draws (`running.rng_guard`),
one CPU thread. Backward regions are not replayed as a chain (their ops need their forward
calls and gradients: they are judged through the region's boundary alone).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ... import ops
from ...numbers import human
from ...store.records import iter_tensors
from ...store.schema import Kind, Phase, Role
from .calls import NotReplayable, flat_tensors, read_once, rebuild_call
from .local import LocalError, compute_dtype, one_thread
from .rules import TensorLocalError, judge_tensor, settle
from .running import autocast_to, rng_guard, shielded

Record = dict[str, Any]
_LOW = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class ChainError(LocalError):
    """The replay verdict of one region (a `LocalError`: the blame reads it as an op's)."""
    ops: int = 0                            # target ops replayed as the chain

    def describe(self) -> str:
        """One clause for a Divergence reason or a row."""
        w = self.worst
        if not self.replayed or w is None:
            return f"not replayed as a chain: {self.reason}"
        lead = (f"replayed as a chain of its {self.ops} target op(s) in float64 from the "
                f"region's saved inputs, the region's own output error is {human(w.error)} "
                f"({w.name}, {w.dtype})")
        if w.culprit == "nonfinite":
            return f"{lead}: the target's output has inf/NaN where the float64 chain's is finite"
        if not w.reference_run:
            return (f"{lead}, within what rounding to {w.dtype} alone makes (at least "
                    f"{human(w.reference_error)}): no chain of its dtypes does clearly better")
        scale = ""
        if w.culprit == "scale" or abs(w.scale_error) > abs(w.reference_scale_error) * 2:
            scale = (f", scaled by {1 + w.scale_error:.6g} against "
                     f"{1 + w.reference_scale_error:.6g}")
        return (f"{lead}, the same ops on the CPU in their own dtypes ({self.reference}) "
                f"make {human(w.reference_error)}{scale}")


def replay_region(name: str, members: list[Record], readers: Readers,
                  load: Callable[[str], Any], policy: Any, shortcut: bool = True) -> ChainError:
    """The replay verdict of the region `name` whose target ops are `members` (records, in
    execution order); `readers` is the target dump's `Readers` (who reads the region's
    outputs).
    Never raises for a region that cannot be replayed: the verdict says why (`replayed` False).

    shortcut: run the own-dtype chain only where the float64 chain alone cannot settle the
    verdict (`rules.settle`, as one op's replay); False runs it always."""
    start = time.perf_counter()
    try:
        with one_thread():
            reference, tensors = _judge(members, readers, read_once(load), policy, shortcut)
    except NotReplayable as exc:
        return ChainError(name, False, reason=str(exc), seconds=time.perf_counter() - start,
                          ops=len(members))
    except Exception as exc:      # a call torch refuses: say so, never guess
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:100]
        return ChainError(name, False, reason=f"replay failed ({text})",
                          seconds=time.perf_counter() - start, ops=len(members))
    return ChainError(name, True, reference=reference, tensors=tuple(tensors),
                      seconds=time.perf_counter() - start, ops=len(members))


def producer_of(desc: dict[str, Any]) -> Optional[tuple[int, str]]:
    """(seq, slot) of the op that made an input (`"producer": [seq, slot]`), or None. A dump is
    untrusted: anything else there (a list for a seq, a dict) is no producer."""
    found = desc.get("producer")
    if not isinstance(found, (list, tuple)) or len(found) != 2:
        return None
    seq, slot = found
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(slot, (int, str)):
        return None
    return seq, str(slot)


class Readers:
    """Who reads which recorded tensor, through the dump's dataflow: built once per dump.
    Module records, which only pass tensors on, are not readers."""

    def __init__(self, records: list[Record]) -> None:
        self.by_producer: dict[tuple[Any, str], list[str]] = {}
        for rec in records:
            if rec["kind"] == Kind.MODULE:
                continue
            for _, role, desc in iter_tensors(rec):
                producer = producer_of(desc) if role == Role.INPUT else None
                if producer is not None:
                    self.by_producer.setdefault(producer, []).append(rec["name"])

    def outputs(self, members: list[Record]) -> list[str]:
        """The tensors the region's ops made that a recorded op outside it reads; without
        any, its last op's outputs."""
        inside = {m["name"] for m in members}
        found = []
        for m in members:
            cut = len(m["name"]) + len(".output.")
            for n, role, _ in iter_tensors(m):
                readers = self.by_producer.get((m["seq"], n[cut:])) \
                    if role == Role.OUTPUT else None
                if readers and any(r not in inside for r in readers):
                    found.append(n)
        return found or [n for n, role, _ in iter_tensors(members[-1]) if role == Role.OUTPUT]


def _refusal(members: list[Record]) -> Optional[str]:
    """Why the chain must not run at all (checked before any op runs), or None."""
    if not members:
        return "it has no target op"
    for rec in members:
        if not isinstance(rec["seq"], int):
            return f"{rec['name']} has no sequence number for the dataflow to name it by"
        if rec["phase"] == Phase.BACKWARD:
            return ("a backward region is judged through its boundary alone (its ops' "
                    "gradients need their forward calls)")
        if rec["kind"] == Kind.KERNEL:
            return (f"{rec['name']} is a compiled kernel, which replay does not re-run (its "
                    f"code is not in the dump)")
        if rec["kind"] not in Kind.REPLAYABLE:
            return f"{rec['name']} is a {rec['kind']} record, made of other ops"
        refused = ops.replay_refusal(str(rec["op"]))
        if refused:
            return f"{rec['name']}: {refused}"
    return None


def _judge(members: list[Record], readers: Readers, load: Callable[[str], Any],
           policy: Any, shortcut: bool) -> tuple[str, list[TensorLocalError]]:
    refused = _refusal(members)
    if refused:
        raise NotReplayable(refused)
    outputs = readers.outputs(members)
    descs = {n: d for m in members for n, role, d in iter_tensors(m) if role == Role.OUTPUT}
    targets = []
    for n in outputs:
        key = descs[n].get("key")
        t = load(key) if key else None
        if not isinstance(t, torch.Tensor):
            raise NotReplayable(f"its output {n} was not saved")
        targets.append(t)
    low = compute_dtype(*members)
    exact, _ = _chain(members, load, torch.float64, outputs)
    for n, t in zip(outputs, targets):
        if tuple(t.shape) != tuple(exact[n].shape):
            raise NotReplayable(f"{n}: replayed shape {list(exact[n].shape)}, saved "
                                f"{list(t.shape)}")
    settled = [settle(n, t, exact[n], policy, compute=low) if shortcut else None
               for n, t in zip(outputs, targets)]
    if all(s is not None for s in settled):
        return f"rounding to {low}" if low else "exact result", [
            s for s in settled if s is not None]
    reference, autocast = _chain(members, load, None, outputs)
    for n, t in zip(outputs, targets):
        if reference[n].dtype != t.dtype:
            raise NotReplayable(f"{n}: the CPU chain in its own dtypes gives {reference[n].dtype}, "
                                f"the dump {t.dtype}")
    kinds = sorted({str(d).replace("torch.", "") for d in autocast if d is not None})
    name = (low or "exact dtypes") + (f", under autocast to {', '.join(kinds)}" if kinds else "")
    return name, [s if s is not None else judge_tensor(n, t, exact[n], reference[n], policy, low)
                  for s, n, t in zip(settled, outputs, targets)]


def _chain(members: list[Record], load: Callable[[str], Any], cast: Optional[torch.dtype],
           wanted: list[str]) -> tuple[dict[str, torch.Tensor], list[Optional[torch.dtype]]]:
    """Run the members in order (cast: float64, or None for their own dtypes); returns the
    tensors named in `wanted` and the autocast each op ran under. Each value is dropped once
    the last op reading it has run."""
    seqs = {m["seq"]: m for m in members}
    last_use: dict[str, int] = {}
    for i, rec in enumerate(members):
        for _, role, desc in iter_tensors(rec):
            producer = producer_of(desc) if role == Role.INPUT else None
            if producer is not None and producer[0] in seqs:
                last_use[f"{seqs[producer[0]]['name']}.output.{producer[1]}"] = i
    values: dict[str, torch.Tensor] = {}
    used: list[Optional[torch.dtype]] = []
    for i, rec in enumerate(members):
        fed = _fed(rec, seqs, values)
        chain_load = _loader(fed, load)
        outs, autocast = _run(rec, chain_load, cast)
        used.append(autocast)
        names = [n for n, role, _ in iter_tensors(rec) if role == Role.OUTPUT]
        shapes = [d.get("shape") for _, role, d in iter_tensors(rec) if role == Role.OUTPUT]
        if len(outs) != len(names):
            raise NotReplayable(f"{rec['name']}: the replay returns {len(outs)} tensors, the "
                                f"dump {len(names)}")
        for n, out, shape in zip(names, outs, shapes):
            if shape is not None and list(out.shape) != list(shape):
                raise NotReplayable(f"{n}: replayed shape {list(out.shape)}, dump {shape}")
            values[n] = out.detach()
        for n in [n for n, at in last_use.items() if at == i and n not in wanted]:
            values.pop(n, None)
    return {n: values[n] for n in wanted}, used


def _fed(rec: Record, seqs: dict[Any, Record], values: dict[str, torch.Tensor]
         ) -> dict[str, torch.Tensor]:
    """{saved key: chain value} for the record's inputs made by earlier ops of the region;
    NotReplayable where an input is neither made there nor saved."""
    fed: dict[str, torch.Tensor] = {}
    for n, role, desc in iter_tensors(rec):
        if role == Role.OUTPUT:
            continue
        producer, key = producer_of(desc), desc.get("key")
        if producer is not None and producer[0] in seqs:
            made = f"{seqs[producer[0]]['name']}.output.{producer[1]}"
            if made not in values:
                raise NotReplayable(f"{n} is read from {made}, which the chain has not made")
            if not key:
                raise NotReplayable(f"{n} has no tensor key to feed the chain's value by")
            if key in fed and fed[key] is not values[made]:
                raise NotReplayable(f"{n}: one saved tensor stands for two chain values")
            fed[key] = values[made]
        elif not key:
            raise NotReplayable(f"{n} is neither a saved input of the region nor made by an "
                                f"earlier op of it")
        elif key in fed:
            raise NotReplayable(f"{n}: one saved tensor stands for a chain value and a saved one")
    return fed


def _loader(fed: dict[str, torch.Tensor], load: Callable[[str], Any]) -> Callable[[str], Any]:
    def chain_load(key: str) -> Any:
        return fed[key] if key in fed else load(key)
    return chain_load


def _run(rec: Record, load: Callable[[str], Any], cast: Optional[torch.dtype]
         ) -> tuple[list[torch.Tensor], Optional[torch.dtype]]:
    """One op of the chain: in float64 (autocast off), or in its own dtypes under the CPU
    autocast that reproduces its recorded output dtypes (None first, then its low dtypes)."""
    recorded = [str(d.get("dtype", "")).replace("torch.", "")
                for _, role, d in iter_tensors(rec) if role == Role.OUTPUT]
    if cast is not None:
        return _call(rec, load, cast, None), None
    low = sorted({d for d in _LOW if str(d).replace("torch.", "") in recorded}, key=str)
    candidates: list[Optional[torch.dtype]] = [None, *low]
    for at, autocast in enumerate(candidates):
        try:
            outs = _call(rec, load, None, autocast)
        except NotReplayable:
            raise
        except Exception:
            if at + 1 == len(candidates):
                raise
            continue
        if [str(o.dtype).replace("torch.", "") for o in outs] == recorded:
            return outs, autocast
    raise NotReplayable(f"{rec['name']}: the CPU kernel does not reproduce the target's output "
                        f"dtypes ({', '.join(recorded)})")


def _call(rec: Record, load: Callable[[str], Any], cast: Optional[torch.dtype],
          autocast: Optional[torch.dtype]) -> list[torch.Tensor]:
    call = rebuild_call(rec, load, cast)    # (allow-list, arguments, --max-tensor-mb)
    with shielded(), rng_guard() as rng, autocast_to(autocast), torch.no_grad():
        out = call.run()
    if rng["consumed"]:
        raise NotReplayable(f"{rec['name']} draws random numbers (a new draw would not match "
                            f"the target's)")
    if out is None and ops.traits(str(rec["op"])).returns_first_argument and call.args:
        out = call.args[0]
    return flat_tensors([out] if not isinstance(out, (tuple, list)) else out)


__all__ = ["ChainError", "Readers", "replay_region", "producer_of"]
