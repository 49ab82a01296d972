"""The compare's low-precision plan (a RECORDS row of `plans.py`; the formats and the judge are
`opdiff.lowp`'s): a run that quantizes (FP8 emulation, torchao float8, a cast before
`torch._scaled_mm`) has each quantize op judged by its own format and scale
(`opdiff.lowp.judge`) before the pair is aligned.

Every quantize op within what its format and scale explain: one note says so (the ops that
read the quantized tensors are then judged as the rest of the compare is: at the coarsest
dtype of the pair, float8). A quantize op outside it (a clipped scale, an amax from a local
piece, a scale applied to another value) is named in an "inconclusive: ..." note with its
module and what went wrong, so a compare never reports agreement past it. Records are not
rewritten.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..lowp.units import quantize_units
from .result import Note
from ..store.schema import Record

if TYPE_CHECKING:
    from ..store.source import DumpSource
    from .options import CompareOptions
    from .plans import Rewritten

_SHOWN = 3          # wrong quantize ops named in the note


def judged_notes(side: str, records: list[Record], dump: "DumpSource") -> list[Note]:
    """What the quantize ops of one side's records say, as notes ([] when it has none)."""
    from ..lowp import judge_run

    if not quantize_units(records):
        return []
    verdicts = judge_run(dump, records)
    wrong = [v for v in verdicts if v.judged and not v.within]
    unjudged = [v for v in verdicts if not v.judged]
    formats = ", ".join(sorted({v.format for v in verdicts}))
    notes = []
    if wrong:
        named = "; ".join(v.words() for v in wrong[:_SHOWN])
        more = f" (and {len(wrong) - _SHOWN} more)" if len(wrong) > _SHOWN else ""
        notes.append(Note(
            f"inconclusive: {len(wrong)} of {len(verdicts)} quantize op(s) of the {side} are "
            f"outside what their format and scale explain: {named}{more}; the ops after it "
            f"differ for that reason (`opdiff fp8-rank` lists every quantize op)",
            Note.INCONCLUSIVE))
    within = len(verdicts) - len(wrong) - len(unjudged)
    if within:
        notes.append(Note(f"low precision: {within} quantize op(s) of the {side} ({formats}) "
                          f"within what their format and scale explain; the ops reading them "
                          f"are judged at float8's tolerance", Note.OTHER))
    if unjudged:
        notes.append(Note(f"low precision: {len(unjudged)} quantize op(s) of the {side} not "
                          f"judged: {unjudged[0].why}", Note.OTHER))
    return notes


class LowPrecision:
    """RECORDS level: each side's quantize ops judged by their format and scale (notes only)."""
    name = "low precision"

    def rewrite(self, target: list[Record], golden: list[Record],
                sources: tuple["DumpSource", "DumpSource"], options: Optional["CompareOptions"] = None
                ) -> Optional["Rewritten"]:
        from .plans import Rewritten      # (plans.py imports this module)

        notes = judged_notes("target", target, sources[0]) + \
            judged_notes("golden", golden, sources[1])
        return Rewritten(target, golden, notes) if notes else None


__all__ = ["LowPrecision", "judged_notes"]
