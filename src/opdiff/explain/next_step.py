"""What to do after a compare: the capture that settles what is left, or the thing to read.

    next_step(chain, result, level="mix", pair=(0, 1))
    # {"action": "capture", "why": ..., "settles": ..,
    #  "config": {"task": "tensor", "level": "mix", "step": [0], "rank": [1],
    #             "tensor": {"scope": [m, m], "list": [], "data_mode": ["all"]}, "dump_path": ...},
    #  "commands": ["opdiff explain OUT --next-config next_capture.json", "opdiff run ..."]}

`action` is one of `ACTIONS`: "capture" (record again with `config`, both runs, then compare),
"read_code" (the culprit is confirmed: its line), "inspect" (a parameter, the data, the seeding:
nothing a capture shows better), "map" (the runs' names do not pair: a mapping file), "none".
The config is msprobe's config.json (what `opdiff run --config` and
`PrecisionDebugger(config_path=...)` read), as `opdiff trend` writes next_dump.json.
"""
from __future__ import annotations

import os
import re
import shlex
from typing import Any, Optional

from ..comparison.result import Origin
from ..store.schema import RecordName

ACTIONS = ("capture", "read_code", "inspect", "map", "none")
NEXT_CONFIG = "next_capture.json"
_STEP_RANK = re.compile(r"^(step|rank)\d+$")
# The level that sees more than a level does (what an unjudged region needs next).
_FINER = {"L0": "mix", "L1": "mix", "mix": "L2"}


def _root(path: Optional[str]) -> str:
    """The dump root of a compared directory (its step{S}/rank{R} dropped)."""
    text = str(path or "dump").rstrip("/\\") or "dump"
    while _STEP_RANK.match(os.path.basename(text)):
        text = os.path.dirname(text) or "."
    return text


def _scope(module: Optional[str], op_name: Optional[str]) -> tuple[list[str], list[str]]:
    """(scope, list) that records the module call's ops (or the op alone), every call."""
    parsed = RecordName.parse(module) if module else None
    if parsed is not None:
        record = parsed.without_index
        return [record, record], []
    parsed = RecordName.parse(op_name) if op_name else None
    if parsed is not None:
        return [], [parsed.without_index]
    return [], []


def capture_config(task: str, level: str, step: Any, rank: Any, dump_path: str,
                   module: Optional[str] = None, op_name: Optional[str] = None) -> dict[str, Any]:
    """The msprobe-style config that records `step` of `rank` (None: every one) at `level`."""
    scope, names = _scope(module, op_name)
    return {"task": task, "dump_path": dump_path, "level": level,
            "step": [] if step is None else [int(step)], "rank": [] if rank is None else [int(rank)],
            task: {"scope": scope, "list": names, "data_mode": ["all"]}}


def _commands(result: Any, output: Optional[str]) -> tuple[list[str], str, str]:
    out = output or "OUT"
    target, golden = _root(result.target) + "-next", _root(result.golden) + "-next"
    q = shlex.quote
    config = q(os.path.join(out, NEXT_CONFIG))
    return [f"opdiff explain {q(out)} --next-config {config}",
            f"opdiff run --config {config} --dump {q(target)} -- <target command>",
            f"opdiff run --config {config} --dump {q(golden)} -- <golden command>",
            f"opdiff compare {q(target)} {q(golden)} -o {q(out.rstrip('/') + '-next')}",
            f"opdiff explain {q(out.rstrip('/') + '-next')}"], target, golden


_OUT = re.compile(r"(?<![\w./-])OUT(?=[/\s-]|$)")


def with_output(chain: dict[str, Any], output: str) -> dict[str, Any]:
    """`chain` with the `OUT` of its commands (summary.json does not know where it lies: a
    folder copied elsewhere stays right) spelled as `output`."""
    nxt = dict(chain.get("next") or {})
    quoted = shlex.quote(str(output).rstrip("/") or "/")
    nxt["commands"] = [_OUT.sub(lambda m: quoted, c) for c in nxt.get("commands") or []]
    return {**chain, "next": nxt}


def _capture(result: Any, output: Optional[str], why: str, settles: str, **config: Any) -> dict[str, Any]:
    commands, target, _ = _commands(result, output)
    return {"action": "capture", "why": why, "settles": settles,
            "config": capture_config(dump_path=target, **config), "commands": commands,
            "where": None}


def _plain(action: str, why: str, settles: str = "", commands: Optional[list[str]] = None,
           where: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {"action": action, "why": why, "settles": settles, "config": None,
            "commands": commands or [], "where": where}


def next_step(chain: dict[str, Any], result: Any, level: Optional[str],
              pair: Optional[tuple[Any, Any]], output: Optional[str] = None) -> dict[str, Any]:
    """The next thing to do for `chain` (see the module doc); `level`: the capture level the
    rows show (None: not opdiff's capture, e.g. ONNX); `pair`: (step, rank) where it stands."""
    step, rank = pair if pair else (result.step, result.rank)
    culprit = chain.get("culprit")
    facts = {f["type"] for f in chain["facts"]}
    stats = "statistics_only" in facts
    capturable = level is not None
    if culprit is not None:
        return _after_culprit(chain, culprit, result, output, level, stats, capturable)
    if chain["verdict"] == "no_divergence":
        if stats and capturable:
            return _capture(result, output, "no op beyond its floor, but from statistics only",
                            "tensors show faults that keep max, min, mean and norm",
                            task="tensor", level=level, step=step, rank=rank)
        return _plain("none", "every difference is within its floor or explained by its inputs",
                      "if the loss still parts later, monitor every step and let `opdiff trend` "
                      "name the step")
    first: dict[str, Any] = next((f for f in chain["facts"] if f["type"] == "first_error_unblamed"), {})
    incomplete = [p for p in result.pairs or [] if isinstance(p, dict) and p.get("incomplete")]
    if incomplete and capturable:
        p = incomplete[0]
        return _capture(result, output, f"step {p.get('step')} rank {p.get('rank')} was not "
                        f"compared: {p['incomplete'].get('why', 'a side is missing')}",
                        "the missing side recorded, the pair compares",
                        task="tensor" if not stats else "statistics", level=level,
                        step=p.get("step"), rank=p.get("rank"))
    if "coverage" in facts and not stats and "unjudged" not in facts:
        return _plain("map", "too few tensors pair between the runs: their names differ",
                      "a mapping file pairs the renamed modules (docs/howto/different-ops.md)",
                      [f"opdiff compare {shlex.quote(str(result.target))} "
                       f"{shlex.quote(str(result.golden))} --map map.yaml -o "
                       f"{shlex.quote((output or 'OUT').rstrip('/') + '-mapped')}"])
    if not capturable:
        return _plain("none", "this compare's runs are not opdiff captures: nothing to record "
                      "again", "read the unjudged notes")
    if stats:
        return _capture(result, output, "inconclusive from statistics only",
                        "tensors let replay judge each op on its own inputs",
                        task="tensor", level=level, step=first.get("step", step),
                        rank=first.get("rank", rank), op_name=first.get("op"))
    finer = _FINER.get(level or "")
    if finer:
        return _capture(result, output, f"inconclusive at level {level}: part of the run is not "
                        "recorded op by op", f"level {finer} records the ops it could not judge",
                        task="tensor", level=finer, step=first.get("step", step),
                        rank=first.get("rank", rank))
    return _plain("none", "inconclusive with tensors at the finest level",
                  "read the unjudged facts: they say what could not be judged and why")


def _after_culprit(chain: dict[str, Any], culprit: dict[str, Any], result: Any,
                   output: Optional[str], level: Optional[str], stats: bool,
                   capturable: bool) -> dict[str, Any]:
    step, rank, origin = culprit.get("step"), culprit.get("rank"), culprit["origin"]
    loc = culprit.get("location")
    # a module call named at L0: the ops inside it were not recorded
    inside_module = culprit.get("record_kind") == "module" and level == "L0"
    if chain["confidence"] != "confirmed" and capturable:
        if stats:
            return _capture(result, output, f"{culprit['name']} is named from statistics only",
                            f"a tensor dump confirms {culprit['name']} (replay on its own inputs) "
                            "or clears it", task="tensor", level="mix" if inside_module else level,
                            step=step, rank=rank, op_name=culprit["name"],
                            module=culprit["name"] if inside_module else culprit.get("module"))
        finer = _FINER.get(level or "")
        if finer:
            return _capture(result, output, "named, but part of the run could not be judged",
                            f"level {finer} records the ops that could not be judged",
                            task="tensor", level=finer, step=step, rank=rank)
    if inside_module and origin == Origin.OP:
        return _capture(result, output, f"{culprit['name']} is a module call: the ops inside it "
                        "were not recorded", "level mix inside that module names the op",
                        task="statistics" if stats else "tensor", level="mix", step=step,
                        rank=rank, module=culprit["name"])
    if origin == Origin.OPTIMIZER and capturable and isinstance(step, int) and step > 0:
        return _capture(result, output, "parameters differ although the step before agreed",
                        "the optimizer's ops of the step before, recorded at L1, name the update",
                        task="tensor", level="L1", step=step - 1, rank=rank)
    if origin == Origin.COLLECTIVE and capturable:
        return _capture(result, output, "the difference arrives through a collective",
                        "every rank of that step recorded shows the rank it comes from",
                        task="tensor", level=level, step=step, rank=None)
    if origin in Origin.LEAVES or origin == Origin.RANDOM:
        what = {Origin.PARAMETER: "the checkpoint or weight conversion of both runs",
                Origin.BUFFER: "how both runs load or update that buffer",
                Origin.INPUT: "the data pipeline of both runs (same batch, same preprocessing)",
                Origin.RANDOM: "the seeding of both runs right before the recorded step"}[origin]
        said = (f"{culprit['name']} drew from generators in different states"
                if origin == Origin.RANDOM else
                f"the difference is there before any op: {culprit.get('tensor')}")
        return _plain("inspect", said,
                      f"compare {what}", where=loc)
    where = f"{loc['file']}:{loc['line']}" if loc else culprit["name"]
    return _plain("read_code", f"{culprit['name']} is {chain['confidence']}",
                  f"read {where} and what it calls; diff it against the trusted version",
                  where=loc)


__all__ = ["next_step", "capture_config", "with_output", "ACTIONS", "NEXT_CONFIG"]
