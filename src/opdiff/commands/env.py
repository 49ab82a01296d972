"""`opdiff env`: print this machine's environment fingerprint, or how it differs from a dump's."""
from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="environment fingerprint, and what differs from a dump's",
                       description="Print the environment fingerprint opdiff writes into every dump "
                                   "(versions, devices, determinism flags, threads). With --diff, "
                                   "list what differs from the environment a dump was recorded in.",
                       epilog="example: opdiff env --diff ./dump/npu")
    p.add_argument("--diff", metavar="DUMP", help="a dump directory to compare this machine with")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..environment import diff, fingerprint
    from ..errors import DumpError
    from ..store.adapters import discover

    here = fingerprint()
    if not args.diff:
        if args.json:
            print(json.dumps(here, indent=2, default=str))
        else:
            for key, value in here.items():
                print(f"{key:28} {value}")
        return 0
    dumps = discover(args.diff)
    other = dumps[0].meta.get("environment")
    if not other:
        raise DumpError(f"{args.diff}: this dump records no environment fingerprint")
    changes = diff(here, other)
    if args.json:
        print(json.dumps(changes, indent=2, default=str))
    elif not changes:
        print("same environment as the dump")
    else:
        from ..terminal import one_line

        print(f"{'key':28} {'here':30} dump")
        for c in changes:       # the dump's side is untrusted: its control characters shown
            print(one_line(f"{c['key']:28} {str(c['target'])[:30]:30} {c['golden']}"))
    return 0
