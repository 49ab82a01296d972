"""`opdiff demo`: what opdiff does, end to end, in one command on a CPU.

Each scenario replays a seed document's story with a tiny model: it trains a golden and a
target run, records both with opdiff, runs the analysis a user would run (compare, or the
overflow check) and writes the same files a user gets (CSV, summary.json, report.html, or
overflow.json), then checks the answer against the fault it planted.

    import opdiff.demo
    result = opdiff.demo.run("iadd", output="./opdiff-demo")
    result.compare.first_divergence.name        # 'Tensor.__iadd__.2.forward'
    result.compare.first_divergence.location    # demo/models.py, the `out += residual` line
    result.found                                # the pipeline named the planted fault

Scenarios: see `list_scenarios()` (`opdiff demo --list`). `wrong-weights` and `dropout` tell
stories where no op is to blame (origin parameter, origin random); they run golden and target in
two processes (`opdiff.demo.runs`), as a user's two scripts would.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from .scenarios import DemoResult

log = logging.getLogger("opdiff")

DEFAULT_OUTPUT = "./opdiff-demo"
DEFAULT_SCENARIO = "iadd"


def list_scenarios() -> dict:
    """{name: one-line description} of every scenario, the default first."""
    from .catalog import SCENARIOS

    return {name: s.summary for name, s in SCENARIOS.items()}


def run(scenario: str = DEFAULT_SCENARIO, output=DEFAULT_OUTPUT,
        console: "Console | None" = None) -> "DemoResult":
    """Play one scenario into the directory `output` and return its `DemoResult`.

    console: a rich Console for the story (None: stdout). `output` must be new, empty, or a
    previous demo's directory (whose files are replaced); anything else raises ConfigError and
    is left untouched.
    """
    from . import workspace
    from .catalog import SCENARIOS
    from .story import Story

    chosen = SCENARIOS.get(scenario)
    if chosen is None:
        raise ConfigError(f"unknown demo scenario {scenario!r}; choose one of "
                          f"{', '.join(SCENARIOS)} (opdiff demo --list)")
    story = Story(console)
    start = time.perf_counter()
    with workspace.hold(output) as out, _demo_process_state():
        result = chosen.player()(out.resolve(), story)
    result.seconds = time.perf_counter() - start
    story.closing(result.files, result.seconds, chosen.advice)
    return result


@contextmanager
def _demo_process_state():
    """The demo runs in the caller's process: put back the global state it changes.

    It seeds every generator (as opdiff.seed_all does in a user's script), asks for deterministic
    kernels, and uses one thread: its tensors are tiny, and on a busy two-core machine handing
    them between threads made the compare five times slower.
    """
    import random

    import numpy as np
    import torch

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    rng = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.random.set_rng_state(rng[2])


def __getattr__(name):
    if name == "DemoResult":
        from .scenarios import DemoResult
        return DemoResult
    raise AttributeError(f"module 'opdiff.demo' has no attribute {name!r}")


__all__ = ["run", "list_scenarios", "DemoResult", "DEFAULT_OUTPUT", "DEFAULT_SCENARIO"]
