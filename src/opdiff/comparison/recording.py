"""What one side of a compare is: how it was recorded, read once from its dump's meta and records.

    from opdiff.comparison.recording import Recording
    side = Recording.read(records, dump.meta, format=dump.format, tensors=dump.holds_tensors)
    side.level, side.backend, side.kernels, side.dataflow

The plan table (`plans.py`) decides from two Recordings (target, golden) how the two runs are
compared; nothing after it asks a dump's meta or scans its records for what they are. A plan
that rewrites a side's records (module calls of compiled code, `compiled_modules.module_calls`)
reads that side's Recording again from what it wrote.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from ..store.schema import Kind, Record
from .compiled_modules import by_inductor

if TYPE_CHECKING:
    from ..store.source import DumpSource

# Backend: what ran the side's model.
EAGER = "eager"             # eager PyTorch (or a foreign dump: its own ops)
FX = "aot_eager"            # torch.compile with a backend that runs FX graphs of aten ops
INDUCTOR = "inductor"       # torch.compile with Inductor: its generated code and extern kernels


def compiled_record(r: Record) -> bool:
    """A record of compiled code (marked by capture/compiled.py), or an aten op of a compiled
    backward (whose autograd node is torch's CompiledFunctionBackward)."""
    return bool(r.get("compiled")) or r.get("autograd_node") == "CompiledFunctionBackward"


def _modules_known(r: Record) -> bool:
    return bool((r.get("compiled") or {}).get("modules"))


@dataclass(frozen=True)
class Recording:
    """One side of a compare, as the plan table sees it."""
    format: str = "opdiff"              # the dump's format ("opdiff", "msprobe", ...)
    level: Optional[str] = None         # "L0" | "L1" | "L2" | "mix"; None: not said
    backend: str = EAGER                # EAGER | FX | INDUCTOR
    kernels: bool = False               # Inductor's own kernels recorded (Kind.KERNEL)
    extern: tuple[str, ...] = ()        # ops of the calls recorded inside Inductor's code
    unplaced: tuple[str, ...] = ()      # ops of Inductor calls whose modules are not known
    module_calls: int = 0               # module calls of compiled code its records hold
    dataflow: bool = False              # inputs name their producers ("producer": [seq, slot])
    tensors: bool = False               # it holds tensors (replay can re-run its ops)
    mapped: bool = False                # a mapping file renamed or dropped its records
    step: Optional[int] = None
    rank: Optional[int] = None
    world: Optional[int] = None         # ranks in its run, where its meta says
    # Slots for the next axes (their packages fill them; None: laid out as one rank, one batch):
    layout: Optional[object] = None     # how its ranks split the model (comparison/layouts/)
    tokens: Optional[object] = None     # how its batches hold the tokens (comparison/tokens/)

    @property
    def compiled(self) -> bool:
        return self.backend != EAGER

    @classmethod
    def of(cls, source: DumpSource, records: Iterable[Record], *,
           mapped: bool = False) -> "Recording":
        """What `source` is, read from its meta and (rewritten) records."""
        return cls.read(records, source.meta, format=source.format,
                        tensors=source.holds_tensors, mapped=mapped, step=source.step,
                        rank=source.rank)

    @classmethod
    def read(cls, records: Iterable[Record], meta: Optional[Mapping[str, Any]], *,
             format: str = "opdiff", tensors: bool = False, mapped: bool = False,
             step: Optional[int] = None, rank: Optional[int] = None) -> "Recording":
        meta = meta or {}
        config = meta.get("config") or {}
        level = config.get("level") if isinstance(config, Mapping) else None
        compiled = inductor = kernels = False
        extern: list[str] = []
        unplaced: list[str] = []
        module_calls = 0
        for r in records:
            compiled = compiled or compiled_record(r)
            if by_inductor(r):
                inductor = True
                extern.append(r["op"])
                if r["kind"] in Kind.OPS and not _modules_known(r):
                    unplaced.append(r["op"])
            kernels = kernels or r["kind"] == Kind.KERNEL
            if r["kind"] == Kind.MODULE and r.get("compiled"):
                module_calls += 1
        world = meta.get("world_size")
        return cls(format=format, level=level if isinstance(level, str) else None,
                   backend=INDUCTOR if inductor else FX if compiled else EAGER,
                   kernels=kernels, extern=tuple(extern), unplaced=tuple(unplaced),
                   module_calls=module_calls, dataflow=bool(meta.get("dataflow")),
                   tensors=tensors, mapped=mapped, step=step, rank=rank,
                   world=world if isinstance(world, int) else None)


__all__ = ["Recording", "EAGER", "FX", "INDUCTOR", "compiled_record"]
