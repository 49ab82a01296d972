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

A forward region:
- its target ops run in execution order, twice: once in float64, once on the CPU in their own
  dtypes (under CPU autocast where that is what reproduces an op's recorded output dtypes);
- each op's tensor inputs come from the chain (an input whose producer, `"producer": [seq,
  slot]` on its descriptor, is an earlier op of the region) or from the region's saved inputs
  (the tensor the target dump saved for it); an input that can be neither leaves the region
  "not replayed" with the reason, nothing is guessed (`replay.chainrun`);
- the region's outputs (the tensors its ops made that a recorded op outside it reads; without
  any, its last op's: `Readers.outputs`) are judged by the rules a replayed op's output is (`rules.settle`, then
  `rules.judge_tensor` with the own-dtype chain as the reference: what a correct chain of
  these dtypes makes).

A backward region of Inductor's compiled backward (kernels whose stored programs compute the
gradients, and the extern kernels between them) is replayed as a forward one is. Any other
backward region (its members are backward records, each naming its forward call) is replayed
as a vector-Jacobian product (`replay.backchain`): the forward calls run as the chain above with
the region's inputs as leaves, and are differentiated with the gradients the target recorded
arriving at the region's outputs; the region's input gradients (what its backward records
saved) are judged against that in float64 and in the ops' own dtypes, by the same rules.

Only what replay runs for one op runs here: ops on the allow-list (`ops.replay_refusal`, checked
for every op before any runs: a dump is untrusted), arguments rebuilt by `calls.rebuild_call`
(each call's result checked against `--max-tensor-mb`), no random draws (`running.rng_guard`),
one CPU thread.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING, cast

import torch

from ...numbers import human
from ...store.records import iter_tensors
from ...store.schema import Kind, Phase, Program, Record, Role, is_inductor
from .backchain import judge_backward
from .calls import NotReplayable, read_once
from .chainrun import Readers, judge_outputs, producer_of, refusal, run_chain
from .local import LocalError, compute_dtype, one_thread
from .rules import TensorLocalError
from .calls import Load

if TYPE_CHECKING:
    from ..verdicts import Policy



@dataclass(frozen=True)
class ChainError(LocalError):
    """The replay verdict of one region (a `LocalError`: the blame reads it as an op's)."""
    ops: int = 0                            # target ops replayed as the chain
    backward: bool = False                  # replayed as a vector-Jacobian product

    def describe(self) -> str:
        """One clause for a Divergence reason or a row."""
        w = self.worst
        if not self.replayed or w is None:
            return f"not replayed as a chain: {self.reason}"
        if self.backward:
            lead = (f"replayed as a chain of the forward calls of its {self.ops} target op(s) "
                    f"in float64 from the region's saved forward inputs, differentiated with "
                    f"the gradients arriving at its outputs (a vector-Jacobian product), the "
                    f"region's own gradient error is {human(w.error)} ({w.name}, {w.dtype})")
        else:
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
                  load: Load, policy: "Policy", shortcut: bool = True) -> ChainError:
    """The replay verdict of the region `name` whose target ops are `members` (records, in
    execution order); `readers` is the target dump's `Readers` (who reads the region's
    outputs, and the records by name: a backward member's forward call).
    Never raises for a region that cannot be replayed: the verdict says why (`replayed` False).

    shortcut: run the own-dtype chain only where the float64 chain alone cannot settle the
    verdict (`rules.settle`, as one op's replay); False runs it always."""
    start = time.perf_counter()
    phases = {m.get("phase") for m in members}
    # (Inductor's compiled backward runs kernels whose programs compute the gradients
    # themselves: replayed as a forward region's chain, from what they read)
    backward = phases == {Phase.BACKWARD} and not any(is_inductor(m) for m in members)
    try:
        if len(phases) > 1:
            raise NotReplayable("its ops are of both phases, forward and backward")
        with one_thread():
            judge = judge_backward if backward else _judge
            reference, tensors = judge(members, readers, read_once(load), policy, shortcut)
    except NotReplayable as exc:
        return ChainError(name, False, reason=str(exc), seconds=time.perf_counter() - start,
                          ops=len(members), backward=backward)
    except Exception as exc:      # a call torch refuses: say so, never guess
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:100]
        return ChainError(name, False, reason=f"replay failed ({text})",
                          seconds=time.perf_counter() - start, ops=len(members),
                          backward=backward)
    return ChainError(name, True, reference=reference, tensors=tuple(tensors),
                      seconds=time.perf_counter() - start, ops=len(members), backward=backward)


def _judge(members: list[Record], readers: Readers, load: Load,
           policy: "Policy", shortcut: bool) -> tuple[str, list[TensorLocalError]]:
    refused = refusal(members)
    if refused:
        raise NotReplayable(refused)
    # (a kernel's results its program does not compute, Inductor's buffers such as a norm's
    # mean kept for the backward, are not judged, as `opdiff check` does not judge them)
    unnamed = {f"{m['name']}.output.{i}" for m in members if m.get("kind") == Kind.KERNEL
               for i in range(len(m["outputs"]))
               # (`refusal` let through only kernels with a program)
               if i not in {o["output"] for o in cast(Program, m["program"])["outputs"]}}
    outputs = [n for n in readers.outputs(members) if n not in unnamed]
    if not outputs:
        raise NotReplayable("its results are buffers its kernels' programs do not compute")
    descs = {n: d for m in members for n, role, d in iter_tensors(m) if role == Role.OUTPUT}
    targets = []
    for n in outputs:
        key = descs[n].get("key")
        t = load(key) if key else None
        if not isinstance(t, torch.Tensor):
            raise NotReplayable(f"its output {n} was not saved")
        targets.append(t)
    exact, _ = run_chain(members, load, torch.float64, outputs)

    def reference() -> tuple[dict[str, torch.Tensor], list[Any]]:
        return run_chain(members, load, None, outputs)
    return judge_outputs(dict(zip(outputs, targets)), exact, reference, policy,
                         compute_dtype(*members), shortcut)


__all__ = ["ChainError", "Readers", "replay_region", "producer_of"]
