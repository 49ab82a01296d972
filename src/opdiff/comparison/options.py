"""How one compare judges every step/rank pair: one frozen object, made once by `compare()`.

    from opdiff.comparison.options import CompareOptions
    options = CompareOptions(policy=Policy({"tolerance": {"bf16": 0.03}}), replay="off")
    compare_pair(target_dump, golden_dump, options)

It travels unchanged from `compare()` through the engine (`engines.py`, `runs.run_pairs`,
`ray_engine.run_pairs_ray`, their worker processes and Ray tasks) to `pair.compare_pair`; a
new option is one field here, checked here. Made with a bad value it raises one line (an
`OpdiffError`, exit 2 from the CLI).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from ..errors import OpdiffError
from .layouts.declared import LayoutFile
from .mapping import Mapping
from .tokens.given import TokenIds, check_token_ids
from .verdicts import Policy

REPLAY_MODES = ("auto", "all", "off")


@dataclass(frozen=True)
class CompareOptions:
    """policy: the verdicts' thresholds and rule (`verdicts.Policy`; a subclass such as the ONNX
        compare's `MsitPolicy` in this process only: worker processes get `portable()`).
    shape_flag: pair ops only when every tensor shape matches (msprobe's `shape_flag`).
    replay: "auto", "all" or "off" (see `opdiff.compare`).
    replay_jobs: processes each pair's replay uses (None: OPDIFF_REPLAY_JOBS, default 1).
    mapping: a parsed mapping file (`mapping.load`), applied to every pair.
    token_ids: input ids given in a file (`tokens.given.load_token_ids`), for dumps that did
        not save theirs (statistics dumps): how each side laid its tokens out."""
    policy: Policy = field(default_factory=Policy)
    shape_flag: bool = False
    replay: str = "auto"
    replay_jobs: Optional[int] = None
    mapping: Optional[Mapping] = None
    token_ids: Optional[TokenIds] = None
    layout: Optional[LayoutFile] = None
    golden_layout: Optional[LayoutFile] = None

    def __post_init__(self) -> None:
        check_replay(self.replay)
        check_token_ids(self.token_ids)
        jobs = self.replay_jobs
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise OpdiffError(f"replay_jobs must be a whole number of processes (1 or more), "
                              f"not {jobs!r}")

    def portable(self) -> "CompareOptions":
        """These options as a worker process or a Ray task rebuilds them: the policy made again
        from its thresholds (what a pair compared elsewhere has always been judged by)."""
        return replace(self, policy=Policy(self.policy.thresholds, self.policy.noise))


def check_replay(replay: object) -> None:
    if replay not in REPLAY_MODES:
        raise OpdiffError(f"replay must be 'auto', 'all' or 'off', not {replay!r}")


__all__ = ["CompareOptions", "REPLAY_MODES", "check_replay"]
