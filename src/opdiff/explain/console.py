"""The evidence chain printed short for a person (`opdiff explain OUT`)."""
from __future__ import annotations

from typing import Any

from ..terminal import one_line


def chain_lines(chain: dict[str, Any]) -> list[str]:
    """The chain as lines of plain text (names from a dump made one line, escapes visible)."""
    culprit = chain.get("culprit")
    head = f"{chain['verdict']} ({chain['confidence']})"
    if culprit:
        where = "".join(f" {k} {culprit[k]}" for k in ("step", "rank") if culprit.get(k) is not None)
        head += f": {culprit['name']}{where}"
    lines = [one_line(head)]
    loc = culprit.get("location") if culprit else None
    if loc:
        lines.append(one_line(f"  at {loc.get('file')}:{loc.get('line')}  `{loc.get('code') or ''}`"))
    if culprit and culprit.get("module"):
        lines.append(one_line(f"  inside {culprit['module']}"))
    lines.append(one_line(f"  why {chain['confidence']}: {chain.get('confidence_why', '')}"))
    if chain["facts"]:
        lines.append("evidence:")
        lines += [one_line(f"  - {fact['type']}: {fact['says']}") for fact in chain["facts"]]
    nxt = chain["next"]
    lines.append(one_line(f"next: {nxt['action']}: {nxt['why']}"))
    if nxt.get("settles"):
        lines.append(one_line(f"  settles: {nxt['settles']}"))
    lines += [one_line(f"  $ {command}") for command in nxt.get("commands") or []]
    return lines


__all__ = ["chain_lines"]
