"""Drive torch's `CompilerBisector` with opdiff's verdict, and say what it found in words.

torch's bisector (`torch._inductor.compiler_bisector`) reruns a compiled step under one backend
after another (eager, aot_eager, aot_eager_decomp_partition, ..._crossref, inductor); in the
first backend whose run differs it turns its subsystems off one at a time (a config change, or
all applications of a pass, decomposition or lowering), and in the subsystem whose removal
makes the difference go away it bisects the number of applications: the N-th one (counted from
0) is where the difference is born. Each run is judged here by `judge.judge` (every tensor by
what its dtype allows), not by allclose.

    result = drive(run_once, state_dir=None, confirm=run_with_env)
    print("\\n".join(result.lines()))

`run_once()` runs the step once under the bisector's current state and returns a `RunVerdict`;
`confirm(env)` runs it with the environment variables that reproduce a finding by hand
(TORCH_BISECT_BACKEND, TORCH_BISECT_SUBSYSTEM, TORCH_BISECT_MAX: read by torch in a fresh
process), so the printed settings are checked, not only derived.
"""
from __future__ import annotations

import contextlib
import io
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .judge import RunVerdict

log = logging.getLogger("opdiff")

# What each backend adds to the one before it, in the bisector's order.
BACKEND_WORDS = {
    "eager": "TorchDynamo's graph capture alone (backend eager)",
    "aot_eager": "AOTAutograd's tracing and functionalization (backend aot_eager)",
    "aot_eager_decomp_partition": "Inductor's decompositions and the partitioner "
                                  "(backend aot_eager_decomp_partition)",
    "aot_eager_decomp_partition_crossref": "the fake-tensor cross-check "
                                           "(backend aot_eager_decomp_partition_crossref)",
    "inductor": "Inductor's passes, lowerings and generated kernels (backend inductor)",
}
CONFIG_MODULES = {"inductor": "torch._inductor.config",
                  "aot_eager_decomp_partition": "torch._functorch.config"}


class StepFailed(Exception):
    """The step raised or exited with an error in one bisector run (not a numerical verdict)."""


@dataclass(frozen=True)
class StageResult:
    """What compile-bisect found.

    answer: "stage" (a backend, and where it told, the subsystem and the application are named),
    "none" (no backend the bisector tries differs from eager: no compiler stage makes the
    difference) or "inconclusive" (`reason` says why). `reproduce` holds shell settings, each
    with what the step then does ("differs" / "agrees"), checked where `confirmed`.
    """
    answer: str
    backend: Optional[str] = None
    subsystem: Optional[str] = None
    application: Optional[int] = None   # the N-th application (from 0) of the subsystem
    detail: Optional[str] = None        # what that application was, when torch tells (aten.silu)
    reason: str = ""
    evidence: str = ""                  # the verdict of the first run that differed
    reproduce: tuple[tuple[str, str], ...] = ()
    confirmed: bool = False
    runs: int = 0
    seconds: float = 0.0
    log: tuple[str, ...] = field(default=(), repr=False)

    @property
    def found(self) -> bool:
        return self.answer == "stage"

    def summary(self) -> str:
        """One line: the answer."""
        if self.answer == "none":
            return ("no compiler stage makes the difference: the step agrees with eager under "
                    "every backend the bisector tries (" + ", ".join(BACKEND_WORDS) + ")")
        if self.answer == "inconclusive":
            return f"inconclusive: {self.reason}"
        words = f"the difference appears with {BACKEND_WORDS.get(self.backend or '', self.backend)}"
        if self.subsystem is None:
            return words + (f"; {self.reason}" if self.reason else "")
        if self.application is None:
            return f"{words}, subsystem {self.subsystem}: {self.reason}"
        what = f": {self.detail}" if self.detail else ""
        return f"{words}, subsystem {self.subsystem}, application #{self.application}{what}"

    def lines(self) -> list[str]:
        """The answer, the evidence and the settings that reproduce it by hand."""
        out = [self.summary()]
        if self.evidence:
            out.append(f"  first run that differs from eager: {self.evidence}")
        if self.reproduce:
            out.append("  to reproduce by hand (your command after these settings)"
                       + (", checked:" if self.confirmed else ":"))
            out.extend(f"    {setting:<72} -> {outcome}" for setting, outcome in self.reproduce)
        out.append(f"  {self.runs} runs in {self.seconds:.1f} s")
        return out


def _state() -> tuple[str, str, str]:
    """(backend, subsystem, run state) the bisector's next run is made under."""
    from torch._inductor.compiler_bisector import CompilerBisector as CB

    backend = CB.get_backend() or ""
    subsystem = CB.get_subsystem() or ""
    state = (CB.get_run_state(backend, subsystem) or "") if subsystem else ""
    if state == "bisect":
        low, high = CB.get_bisect_range(backend, subsystem)
        state = f"applications 0..{(low + high) // 2} on (range {low}..{high})"
    elif state == "test_disable":
        state = "turned off"
    elif state == "find_max_bounds":
        state = "counting applications"
    return backend, subsystem, state


class _LogLines(io.TextIOBase):
    """torch's bisector prints its progress: into opdiff's log, and kept for the result."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self.lines.append(line)
                log.info("bisector: %s", line)
        return len(text)


def settings_for(backend: str, subsystem: Optional[str] = None,
                 most: Optional[int] = None) -> dict[str, str]:
    """The environment that makes a fresh process compile as the bisector did (torch reads
    TORCH_BISECT_*: torch.compile then uses `backend`, and only the applications 0..`most` of
    `subsystem` are made; -1: none)."""
    env = {"TORCH_BISECT_BACKEND": backend}
    if subsystem is not None:
        env["TORCH_BISECT_SUBSYSTEM"] = subsystem
        env["TORCH_BISECT_MAX"] = str(-1 if most is None else most)
    return env


def shell(env: dict[str, str], extra: str = "") -> str:
    return " ".join(f"{k}={v}" for k, v in env.items()) + (f"  ({extra})" if extra else "")


def drive(run_once: Callable[[], RunVerdict], *, state_dir: Optional[str] = None,
          confirm: Optional[Callable[[dict[str, str]], RunVerdict]] = None,
          progress: Optional[Callable[[str], None]] = None) -> StageResult:
    """Bisect with `run_once` as the judge (see the module docstring). state_dir: where the
    bisector keeps its state; the processes a run starts must find it there too (their
    TORCHINDUCTOR_CACHE_DIR); None: a temporary directory of ours, for runs in this process."""
    from torch._inductor.compiler_bisector import BACKENDS, ConfigChange
    from torch._inductor.compiler_bisector import CompilerBisector as CB

    say = progress or (lambda text: log.info("%s", text))
    runs: list[RunVerdict] = []
    first_bad: list[RunVerdict] = []

    def judged() -> bool:
        backend, subsystem, state = _state()
        with contextlib.redirect_stdout(stdout):     # the step's own prints, and progress
            verdict = run_once()
        runs.append(verdict)
        if not verdict.agrees and not first_bad:
            first_bad.append(verdict)
        where = backend + (f" / {subsystem} {state}" if subsystem else "")
        with contextlib.redirect_stdout(stdout):
            say(f"run {len(runs)}: {where}: {'agrees' if verdict.agrees else 'differs'} "
                f"({verdict.reason})")
        return verdict.agrees

    started = time.perf_counter()
    stdout = sys.stdout
    sink = _LogLines()
    enabled = CB.bisection_enabled
    # torch's do_bisect removes the bisect state under its in_process_cache, or under the
    # user's own Inductor cache when none is set: always give it one of ours.
    own = tempfile.mkdtemp(prefix="opdiff-bisect-") if state_dir is None else None
    CB.in_process_cache = state_dir or own
    found: Any = None
    failure, error = "", None
    try:
        with contextlib.redirect_stdout(sink):
            try:
                found = CB.do_bisect(judged)
            except StepFailed as exc:
                failure = str(exc)
            except RuntimeError as exc:   # torch's own checks, e.g. agreed where it had differed
                failure = (f"the step differed and then agreed under the same settings ({exc}); "
                           f"is it deterministic?" if "find_max_bounds" in str(exc)
                           else f"the bisector stopped: {exc}")
            except Exception as exc:  # noqa: BLE001 - raised again below, once torch cleaned up
                error = exc.with_traceback(None)
            # (torch cleans its state up when do_bisect's frame goes: here, not later)
    finally:
        CB.bisection_enabled = enabled
        CB.in_process_cache = None
        if own:
            shutil.rmtree(own, ignore_errors=True)
    if error is not None:
        raise error
    if failure:
        return _done(StageResult("inconclusive", reason=failure), runs, started, sink, first_bad)
    if found is None:
        return _done(StageResult("none"), runs, started, sink, first_bad)
    backend, subsystem = found.backend, found.subsystem
    order = list(BACKENDS)
    before = order[order.index(backend) - 1] if order.index(backend) > 0 else None
    if subsystem is None:
        if BACKENDS.get(backend):
            return _done(StageResult(
                "inconclusive", backend=backend,
                reason=f"the difference appears with {BACKEND_WORDS.get(backend, backend)}, but "
                       f"turning off none of its subsystems ({', '.join(s.name for s in BACKENDS[backend])}) "
                       f"one at a time removes it"), runs, started, sink, first_bad)
        reproduce = [(shell(settings_for(backend)), "differs")]
        if before:
            reproduce.append((shell(settings_for(before)), "agrees"))
        result = StageResult("stage", backend=backend, reason="it has no subsystems the bisector "
                             "can turn off", reproduce=tuple(reproduce))
        return _confirmed(result, confirm, runs, started, sink, first_bad)
    change = next((s for s in BACKENDS[backend] if s.name == subsystem), None)
    if isinstance(change, ConfigChange):
        module = CONFIG_MODULES.get(change.config_name, change.config_name)
        fix = f"{module}.{change.config_field} = {change.config_value!r}"
        result = StageResult("stage", backend=backend, subsystem=subsystem,
                             reason=f"it goes away with {fix}",
                             reproduce=((shell(settings_for(backend)), "differs"),
                                        (shell(settings_for(backend), f"and in the script: {fix}"),
                                         "agrees")))
        return _confirmed(result, None, runs, started, sink, first_bad)
    n = int(found.bisect_number or 0)
    detail = _op_name(found.debug_info)
    result = StageResult("stage", backend=backend, subsystem=subsystem, application=n,
                         detail=detail, reproduce=(
                             (shell(settings_for(backend, subsystem, n)), "differs"),
                             (shell(settings_for(backend, subsystem, n - 1)), "agrees")))
    return _confirmed(result, confirm, runs, started, sink, first_bad)


def _op_name(debug_info: Optional[str]) -> Optional[str]:
    """"<OpOverload(op='aten.silu', overload='default')>" -> "aten.silu.default"."""
    if not debug_info:
        return None
    text = debug_info.strip()
    if text.startswith("<OpOverload(op='") and "overload='" in text:
        op = text.split("op='", 1)[1].split("'", 1)[0]
        overload = text.split("overload='", 1)[1].split("'", 1)[0]
        return f"{op}.{overload}"
    return text


def _confirmed(result: StageResult, confirm, runs, started, sink, first_bad) -> StageResult:
    """Run the settings printed for the user; a finding they do not reproduce is inconclusive."""
    from dataclasses import replace

    if confirm is not None and result.reproduce:
        for setting, outcome in result.reproduce:
            env = dict(part.split("=", 1) for part in setting.split("  (")[0].split())
            verdict = confirm(env)
            runs.append(verdict)
            if verdict.agrees != (outcome == "agrees"):
                return _done(replace(result, answer="inconclusive", reason=(
                    f"the bisector named {result.backend}"
                    + (f" / {result.subsystem}" if result.subsystem else "")
                    + (f" #{result.application}" if result.application is not None else "")
                    + f", but with {setting} the step {'agrees' if verdict.agrees else 'differs'}"
                      f" ({verdict.reason})")), runs, started, sink, first_bad)
        result = replace(result, confirmed=True)
    return _done(result, runs, started, sink, first_bad)


def _done(result: StageResult, runs, started, sink, first_bad) -> StageResult:
    from dataclasses import replace

    return replace(result, runs=len(runs), seconds=time.perf_counter() - started,
                   evidence=first_bad[0].reason if first_bad else "", log=tuple(sink.lines))


__all__ = ["StageResult", "StepFailed", "drive", "settings_for", "BACKEND_WORDS"]
