"""`opdiff query OUT [EXPR] [--json]`: the rows of a compare that match an expression, streamed."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff query ./out 'result == "error"'
  opdiff query ./out 'module ~ "layers\\.1\\." and error > 1e-3' --json
  opdiff query ./out --result error --phase backward --count
  opdiff query ./out 'metrics.Cosine < 0.999 and mode == "tensor"' --fields name,error,module

OUT is the directory of an `opdiff compare` (or `opdiff onnx`), its summary.json or rows.jsonl.
EXPR: fields of a row (target_name, golden_name, name, op_name, role, phase, kind, index, module,
result, reason, mode, error, scale_error, step, rank, target_dtype, region, ... and
metrics.NAME, target_stats.max, ...), compared with == != < <= > >= ~ (regex) !~ in [..],
joined with and, or, not and parentheses; quoted text, numbers, true, false, null. The flags
add conditions. Rows are read one at a time (any size); matches print in execution order.
Exit codes: 0 done, 2 bad input (no rows.jsonl, an expression that does not parse)."""

_TEXT_FIELDS = ("name", "result", "error", "module")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "query", help="filter the rows of a compare with an expression",
        description="Print the rows of a compare's rows.jsonl that match an expression and flags.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", metavar="OUT", help="a compare's output directory, summary.json or rows.jsonl")
    p.add_argument("expr", metavar="EXPR", nargs="?", default="", help="the condition rows must meet")
    p.add_argument("--json", action="store_true", help="one JSON object per matching row")
    p.add_argument("--count", action="store_true", help="print only how many rows match")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="stop after N matching rows (default: all with --json, 50 otherwise)")
    p.add_argument("--fields", metavar="A,B", default=None, help="the row fields to print")
    for flag, what in (("result", "pass, warning, error or unmatched"), ("phase", "forward or backward"),
                       ("role", "input, output or parameters"), ("mode", "tensor or statistics")):
        p.add_argument(f"--{flag}", default=None, help=f"only rows of this {flag}: {what}")
    p.add_argument("--module", default=None, metavar="TEXT", help="only rows whose module contains TEXT")
    p.add_argument("--op", default=None, metavar="TEXT", help="only rows whose op record contains TEXT")
    p.add_argument("--step", type=int, default=None, help="only rows of this step")
    p.add_argument("--rank", type=int, default=None, help="only rows of this rank")
    p.set_defaults(run=run)


def _flag_terms(args) -> list[str]:
    import json
    import re

    terms = [f"{flag} == {json.dumps(getattr(args, flag))}"
             for flag in ("result", "phase", "role", "mode") if getattr(args, flag) is not None]
    terms += [f"{field} ~ {json.dumps(re.escape(text))}"
              for field, text in (("module", args.module), ("op_name", args.op)) if text is not None]
    terms += [f"{flag} == {getattr(args, flag)}" for flag in ("step", "rank")
              if getattr(args, flag) is not None]
    return terms


def run(args) -> int:
    from ..errors import ConfigError
    from ..explain.query import Query
    from ..explain.rowfile import row_dict, rows_path
    from ..report.rows import iter_rows

    query = Query.all_of([args.expr or ""] + _flag_terms(args))
    fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
    if fields:
        from ..explain.query import FIELDS
        unknown = [f for f in fields if f not in FIELDS]
        if unknown:
            raise ConfigError(f"--fields: no field {unknown[0]!r}; fields: {', '.join(FIELDS)}")
    if args.limit is not None and args.limit < 0:
        raise ConfigError(f"--limit must be 0 or more; got {args.limit}")
    path = rows_path(args.output)
    limit = args.limit if args.limit is not None else (None if args.json or args.count else 50)
    shown = matched = 0
    for row in iter_rows(path):
        if not query.matches(row):
            continue
        matched += 1
        if args.count or (limit is not None and shown >= limit):
            continue
        shown += 1
        _print(row_dict(row, fields or (None if args.json else _TEXT_FIELDS)), args.json)
    if args.count:
        print(matched)
    elif not args.json and matched > shown:
        print(f"... {matched - shown} more row(s) match (--limit N, or --json for every one)")
    elif not args.json and not matched:
        print("no row matches")
    return 0


def _print(d: dict, as_json: bool) -> None:
    if as_json:
        from ..store.records import dumps
        print(dumps(d))
        return
    from ..terminal import one_line
    print("  ".join(one_line(_cell(v)) for v in d.values()))


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)
