"""`opdiff fp8-rank RUN [--format e4m3] [--granularity tensor|row] [--json]`: every quantize op
of a run judged by its own format and scale, and the run's GEMMs ranked by the error a
low-precision format adds to them (where to keep high precision)."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff fp8-rank ./dump/fp8                 # an FP8 run: its quantize ops, its GEMMs measured
  opdiff fp8-rank ./dump/bf16 --format e4m3  # a bf16 run: its GEMMs replayed in e4m3 (what-if)
  opdiff fp8-rank ./dump/bf16 --granularity row --json --top 5

RUN is one step/rank of a dump recorded with task="tensor" (a root holding one step and rank
works too). A quantize op is a cast to a float8 dtype; its scale is the multiply or divide
before it. Each is checked element by element: |q / s - x| must stay within half a step of the
format at q; clipped elements (a scale too large, an amax taken on a local piece) break it and
are named. GEMMs (linear, mm, matmul, addmm, bmm) are ranked by the relative error of their
output: in a run that quantizes, their quantized inputs against the values they came from; in
a run that does not, their inputs quantized to --format with an amax scale per tensor (or per
row). Exit codes: 0 done, 1 with --fail-on-divergence when a quantize op is outside its format
and scale, 2 bad input."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "fp8-rank", help="quantize ops judged by their format, GEMMs ranked by FP8 error",
        description="Judge every quantize op of a run by its own format and scale, and rank "
                    "the run's GEMMs by the error a float8 format adds to their output.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dump", metavar="RUN", help="a dump (one step/rank) recorded with tensors")
    p.add_argument("--format", default="e4m3",
                   help="the float8 format a high-precision run's GEMMs are replayed in: e4m3 "
                        "(default), e5m2, e4m3fnuz, e5m2fnuz")
    p.add_argument("--granularity", default="tensor", choices=("tensor", "row"),
                   help="one amax scale per tensor (default) or per row, for the replay")
    p.add_argument("--top", type=int, default=10, metavar="N", help="GEMMs shown (default 10)")
    p.add_argument("--json", action="store_true", help="print the verdicts and ranking as JSON")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 1 when a quantize op is outside what its format and scale explain")
    p.set_defaults(run=run)


def _one_dump(path: str):
    from ..errors import DumpError
    from ..store.adapters import discover

    dumps = discover(path)
    if len(dumps) != 1:
        raise DumpError(f"{path}: holds {len(dumps)} step/rank dumps; give one step/rank "
                        f"directory (e.g. {dumps[0].path})")
    if not dumps[0].holds_tensors:
        raise DumpError(f"{path}: a statistics dump; fp8-rank needs the tensors: record with "
                        f"task=\"tensor\"")
    return dumps[0]


def run(args) -> int:
    from ..errors import ConfigError
    from ..lowp import format_of, judge_run
    from ..lowp.rank import rank_gemms
    from ..terminal import console

    fmt = format_of(args.format)
    if fmt is None or fmt.packed or fmt.scale_only:
        raise ConfigError(f"--format {args.format}: not a float8 data format; use e4m3, e5m2, "
                          f"e4m3fnuz or e5m2fnuz")
    if args.top < 1:
        raise ConfigError("--top must be 1 or more")
    dump = _one_dump(args.run_dump)
    records = list(dump.records())
    verdicts = judge_run(dump, records)
    ranked = rank_gemms(records, dump.tensor, fmt.name, args.granularity)
    wrong = [v for v in verdicts if v.judged and not v.within]
    if args.json:
        from ..store.records import json_text
        print(json_text({"quantize_ops": [v.to_json() for v in verdicts],
                         "outside": [v.record for v in wrong],
                         "gemms": [g.to_json() for g in ranked[:args.top]]}, indent=2))
    else:
        out = console()
        if not verdicts:
            out.print("no quantize ops (no cast to a float8 dtype) in this run")
        elif wrong:
            out.print(f"{len(wrong)} of {len(verdicts)} quantize op(s) outside what their format "
                      f"and scale explain:")
            for v in wrong:
                out.print(f"  {v.words()}")
        else:
            out.print(f"{len(verdicts)} quantize op(s), each within what its format and scale "
                      f"explain")
        if not ranked and verdicts:
            out.print("no GEMM reads these quantize ops through recorded ops (torchao's float8 "
                      "tensors are made outside them): rank the bf16 run's GEMMs instead (what-if)")
        elif not ranked:
            out.print("no GEMM whose inputs could be read (record with task=\"tensor\")")
        else:
            out.print(f"GEMMs by the error low precision adds ({ranked[0].how}), largest first:")
            for i, g in enumerate(ranked[:args.top], 1):
                out.print(f"  {i:2d}. {g.error:.3e}  {g.record}  {g.module or ''}")
    return 1 if wrong and args.fail_on_divergence else 0
