"""`opdiff explain OUT [--json] [--next-config FILE]`: a compare's verdict as a chain of evidence,
with the next step to take."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff explain ./out                  # the chain, short, for a person
  opdiff explain ./out --json           # the same as JSON (summary.json's "evidence")
  opdiff explain ./out --next-config ./out/next_capture.json   # the capture that settles what is left

OUT is the directory of an `opdiff compare` (or `opdiff onnx`), or its summary.json. The chain:
the verdict (culprit, origin, inconclusive, no_divergence), the culprit, the typed facts it rests
on (inputs agree within their dtype floor, the output does not, by how much; replay; upstream ops
cleared and why; what could not be judged), a confidence (confirmed, probable, none) and the next
step: record again with a config (`opdiff run --config FILE`), read a line of code, inspect a
checkpoint, the data or the seeding. Exit codes: 0 done, 2 bad input (no summary.json, no
capture to write)."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "explain", help="a compare's verdict as a chain of evidence, and the next step",
        description="Print the evidence chain of a compare's verdict: the culprit, the facts it "
                    "rests on, a confidence class and the next capture or file to read.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", metavar="OUT", help="a compare's output directory (or its summary.json)")
    p.add_argument("--json", action="store_true", help="print the chain as JSON")
    p.add_argument("--next-config", metavar="FILE", default=None,
                   help="write the next capture's config.json there (for opdiff run --config or "
                        "PrecisionDebugger(config_path=...)); exit 2 when no capture is proposed")
    p.set_defaults(run=run)


def load_chain(output) -> dict:
    """The chain of the compare in `output` (a directory or its summary.json): summary.json's
    "evidence", or, for a summary written before it had one, built from its rows."""
    import json
    from pathlib import Path

    from ..errors import DumpError
    from ..explain import evidence_of
    from ..report.summary import load_summary

    path = Path(output)
    summary = path / "summary.json" if path.is_dir() else path
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DumpError(f"{summary}: cannot read it ({exc.strerror}); give the -o directory of "
                        "an opdiff compare") from None
    except ValueError as exc:
        raise DumpError(f"{summary}: not a summary.json written by opdiff ({exc})") from None
    if not isinstance(data, dict) or "counts" not in data:
        raise DumpError(f"{summary}: not the summary.json of opdiff compare (explain reads a "
                        "compare's; opdiff trend writes next_dump.json itself)")
    from ..explain.next_step import with_output

    chain = data.get("evidence")
    if not (isinstance(chain, dict) and "verdict" in chain):
        chain = evidence_of(load_summary(summary))
    return with_output(chain, str(output) if path.is_dir() else str(summary.parent))


def run(args) -> int:
    import sys

    from ..explain.files import write_config

    chain = load_chain(args.output)
    if args.next_config:
        write_config(chain, args.next_config)
    if args.json:
        from ..store.records import json_text
        print(json_text(chain, indent=2))
    else:
        from ..explain.console import chain_lines
        print("\n".join(chain_lines(chain)))
    if args.next_config:
        print(f"wrote {args.next_config}", file=sys.stderr)
    return 0
