"""Dumps of a tiny Llama computing the same tokens in other layouts (tokenkit.py), made once per
test session and shared by the tests of comparison/tokens."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pytest

from tokenkit import make_dump


@pytest.fixture(scope="session")
def token_dump(tmp_path_factory) -> Callable[..., Path]:
    made: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("tokens")

    def get(layout: str, fault: Optional[str] = None, task: str = "tensor",
            family: str = "llama") -> Path:
        key = (layout, fault, task, family)
        if key not in made:
            name = "_".join(str(k).replace(":", "-").replace(".", "-") for k in key)
            made[key] = make_dump(root / name, *key)
        return made[key]

    return get
