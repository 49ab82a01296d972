"""Low-precision formats (float8 e4m3/e5m2, float4), judged by their own rounding.

    from opdiff.lowp import judge_run, rank_gemms
    verdicts = judge_run(dump)          # every quantize op of one run against its format/scale
    [v.words() for v in verdicts if not v.within]   # the ops whose scale is wrong
    rank_gemms(list(dump.records()), dump.tensor)   # GEMMs by the error low precision adds

`formats.py` holds the facts of each format (torch-free), `units.py` finds quantize ops and
the GEMMs that read them in records (torch-free), `judge.py` checks a quantize op element by
element against what its format and scale explain, `rank.py` ranks GEMMs. The compare's plan
row that says so in a compare is `comparison/lowprecision.py` (a RECORDS row of its plans).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from .formats import FORMATS, Format, format_of, is_low_precision
from .units import QuantizeUnit, quantize_units

if TYPE_CHECKING:
    from ..store.source import DumpSource
    from .judge import UnitVerdict


def judge_run(dump: "DumpSource", records: Optional[Iterable[Mapping[str, Any]]] = None
              ) -> list["UnitVerdict"]:
    """Every quantize op of one step/rank dump judged by its format and scale (`judge.py`),
    and by how the GEMMs that read it dequantize it: by the same scale, or the op is named
    (`UnitVerdict.dequantized`)."""
    from dataclasses import replace

    from .judge import dequantized_ratio, judge_unit
    from .units import Dataflow, gemm_inputs, gemms

    records = list(dump.records()) if records is None else list(records)
    found = quantize_units(records)
    verdicts = {u.record: judge_unit(u, dump.tensor) for u in found}
    flow = Dataflow(records)
    for gemm in gemms(records):
        reads = [d for d in gemm.get("inputs") or [] if isinstance(d, Mapping)
                 and d.get("type") == "tensor"]
        for unit, read in zip(gemm_inputs(gemm, found, flow), reads):
            ratio = None if unit is None else dequantized_ratio(unit, read, dump.tensor)
            if unit is not None and ratio is not None and not verdicts[unit.record].dequantized:
                verdicts[unit.record] = replace(verdicts[unit.record], dequantized=(
                    f"{gemm['name']} reads it dequantized by another scale than its own "
                    f"({ratio:.3g}x the value q / s)"))
    return [verdicts[u.record] for u in found]


def rank_gemms(records: Any, load: Any, fmt: str = "float8_e4m3fn", granularity: str = "tensor"
               ) -> list[Any]:
    """See `opdiff.lowp.rank.rank_gemms`."""
    from .rank import rank_gemms as ranked
    return ranked(records, load, fmt, granularity)


__all__ = ["Format", "FORMATS", "format_of", "is_low_precision", "QuantizeUnit",
           "quantize_units", "judge_run", "rank_gemms"]
