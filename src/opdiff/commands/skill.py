"""`opdiff skill [--install DIR]`: the skill file that teaches a coding agent to debug precision
with opdiff."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff skill                               # print it
  opdiff skill --install .claude/skills      # write .claude/skills/opdiff/SKILL.md

The skill (Markdown with name/description front matter) says when to record what, how to read
`opdiff explain`'s chain, how to take its next step, and what never to conclude. --install
writes DIR/opdiff/SKILL.md; a different file already there is left alone (exit 2) unless
--force. Exit codes: 0 done, 2 bad input."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "skill", help="print or install the skill file for coding agents",
        description="Print the opdiff skill for coding agents, or write it where an agent looks "
                    "for skills.", epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--install", metavar="DIR", default=None,
                   help="write DIR/opdiff/SKILL.md (DIR: e.g. .claude/skills or ~/.claude/skills)")
    p.add_argument("--force", action="store_true", help="replace a different SKILL.md there")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from ..explain.files import write_new
    from ..explain.skill import skill_text

    text = skill_text()
    if not args.install:
        print(text, end="")
        return 0
    path = Path(args.install).expanduser() / "opdiff" / "SKILL.md"
    changed = write_new(path, text, "opdiff skill", force=args.force)
    print(f"{'wrote' if changed else 'up to date:'} {path}")
    return 0
