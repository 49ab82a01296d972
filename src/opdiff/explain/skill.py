"""The skill file for coding agents, shipped in the package (`opdiff skill`)."""
from __future__ import annotations

from importlib import resources

SKILL = "SKILL.md"


def skill_text() -> str:
    """The text of SKILL.md (package data beside this module)."""
    return resources.files(__package__).joinpath(SKILL).read_text(encoding="utf-8")


__all__ = ["skill_text", "SKILL"]
