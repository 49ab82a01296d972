"""Input ids given in a file, for dumps that did not save them (statistics dumps), so that how
each side laid its tokens out can still be known (`opdiff compare --token-ids FILE`).

The file is JSON: each side's ids, one list per batch row (padding included), and optionally
its attention mask (1: a real token) of the same shape::

    {"target": [[5, 9, 3, 0], [7, 2, 8, 4]], "target_mask": [[1, 1, 1, 0], [1, 1, 1, 1]],
     "golden": [[7, 2, 8, 4]]}

    given = load_token_ids("ids.json")      # OpdiffError, one line, on a bad file
    CompareOptions(token_ids=given)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

from ...errors import OpdiffError

MAX_BYTES = 64 << 20            # a file of ids larger than this is not one
Rows = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class TokenIds:
    """Each side's ids (rows of one length) and masks (None: every token real), and the file."""

    target: Rows
    golden: Rows
    target_mask: Optional[Rows] = None
    golden_mask: Optional[Rows] = None
    path: str = ""

    def side(self, which: str) -> tuple[Rows, Optional[Rows]]:
        return (self.target, self.target_mask) if which == "target" else \
            (self.golden, self.golden_mask)


def _rows(value: object, where: str, mask: bool = False) -> Rows:
    if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
        raise OpdiffError(f"{where} must be a list of rows, each a list of "
                          f"{'0s and 1s' if mask else 'token ids'}")
    length = len(value[0])
    for r, row in enumerate(value):
        if len(row) != length or not row:
            raise OpdiffError(f"{where}: row {r} holds {len(row)} ids, row 0 {length}: every row "
                              f"of a batch has one length (padding included)")
        for v in row:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (mask and v > 1):
                raise OpdiffError(f"{where}: row {r} holds {v!r}, not "
                                  f"{'0 or 1' if mask else 'a token id (a whole number >= 0)'}")
    return tuple(tuple(row) for row in value)


def load_token_ids(path: "str | os.PathLike[str]") -> TokenIds:
    """The ids of a file (see the module docstring); OpdiffError naming the file on a bad one."""
    name = os.fspath(path)
    try:
        if os.path.getsize(name) > MAX_BYTES:
            raise OpdiffError(f"{name}: larger than {MAX_BYTES >> 20} MiB; not a file of ids")
        with open(name, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise OpdiffError(f"{name}: cannot read the token ids file ({exc.strerror})") from None
    except ValueError as exc:
        raise OpdiffError(f"{name}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not {"target", "golden"} <= set(data):
        raise OpdiffError(f'{name}: a JSON object with "target" and "golden" (rows of ids) is '
                          f'expected')
    unknown = sorted(set(data) - {"target", "golden", "target_mask", "golden_mask"})
    if unknown:
        raise OpdiffError(f"{name}: unknown key {unknown[0]!r} (target, golden, target_mask, "
                          f"golden_mask)")
    sides = {k: _rows(data[k], f"{name}: {k}") for k in ("target", "golden")}
    masks: dict[str, Optional[Rows]] = {}
    for side in ("target", "golden"):
        given = data.get(f"{side}_mask")
        masks[side] = None if given is None else _rows(given, f"{name}: {side}_mask", True)
        found = masks[side]
        if found is not None and (len(found), len(found[0])) != \
                (len(sides[side]), len(sides[side][0])):
            raise OpdiffError(f"{name}: {side}_mask is {len(found)} x {len(found[0])}, its ids "
                              f"{len(sides[side])} x {len(sides[side][0])}")
    return TokenIds(sides["target"], sides["golden"], masks["target"], masks["golden"], name)


def check_token_ids(value: object) -> None:
    if value is not None and not isinstance(value, TokenIds):
        raise OpdiffError(f"token_ids must come from load_token_ids (a file of ids), not "
                          f"{type(value).__name__}")


__all__ = ["TokenIds", "load_token_ids", "check_token_ids"]
