"""torch.compile's edge cases under capture (issue 26): a graph break, a recompile, dynamic
shapes, `torch.compile` of one submodule only, and activation checkpointing inside the compiled
code. In each, capture adds no graph break and no recompile (dynamo's counters and guard
failures are those of the same step without opdiff), the step stays bitwise identical, and the
healthy pair against eager names nothing. Tiny two-block model, `backend="aot_eager"`.

At level mix the global module hooks stay registered between steps (capture/modules.py): three
recorded steps of a compiled model compile once."""
from __future__ import annotations

import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch
import torch._dynamo
import torch.utils.checkpoint as checkpoint
from torch._dynamo.utils import counters, guard_failures

import opdiff
from opdiff.report.console import verdict_line

CASES = ["graph_break", "recompile", "dynamic", "submodule", "checkpoint"]


class Block(torch.nn.Module):
    def __init__(self, graph_break: bool, recompute: bool):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.graph_break, self.recompute = graph_break, recompute

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.up(x))
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.norm(self.down(h)) + x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute:
            return checkpoint.checkpoint(self.inner, x, use_reentrant=False)
        return self.inner(x)


class Net(torch.nn.Module):
    def __init__(self, graph_break: bool = False, recompute: bool = False):
        super().__init__()
        self.first = Block(graph_break, recompute)
        self.second = Block(graph_break, recompute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)).square().mean()


def _inputs(case: str) -> list[torch.Tensor]:
    """One call; two calls of other batch sizes where the case is about shapes."""
    rows = [4, 6] if case in ("recompile", "dynamic") else [4]
    return [torch.randn(n, 8, generator=torch.Generator().manual_seed(n)) for n in rows]


def _compiled(case: str, model: Net) -> Callable[[torch.Tensor], torch.Tensor]:
    if case == "submodule":      # only the second block is compiled; the model runs eagerly
        model.second = torch.compile(model.second, backend="aot_eager")  # type: ignore
        return model
    return torch.compile(model, backend="aot_eager",
                         dynamic=True if case == "dynamic" else None)


@dataclass
class Step:
    loss: torch.Tensor
    grads: torch.Tensor
    graph_breaks: dict[str, int]
    stats: dict[str, int]
    guard_failures: list[str]
    path: Optional[Path]


def _step(case: str, level: Optional[str], path: Optional[Path], compiled: bool = True) -> Step:
    torch.manual_seed(0)
    model = Net(graph_break=case == "graph_break", recompute=case == "checkpoint")
    run = _compiled(case, model) if compiled else model
    torch._dynamo.reset()
    counters.clear()
    guard_failures.clear()
    with opdiff.dump(model, str(path), level=level) if level else nullcontext():
        loss = sum(run(x) for x in _inputs(case))
        loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    failures = [str(r) for reasons in guard_failures.values() for r in reasons]
    step = Step(loss.detach(), grads, dict(counters["graph_break"]), dict(counters["stats"]),
                failures, path)
    torch._dynamo.reset()
    return step


@pytest.fixture(scope="module")
def edge_step(tmp_path_factory) -> Callable[..., Step]:
    """edge_step(case, level): the compiled step (level None: without opdiff); eager=True: the
    same step not compiled (the golden side)."""
    made: dict[tuple[Any, ...], Step] = {}
    root = tmp_path_factory.mktemp("edge")

    def get(case: str, level: Optional[str], eager: bool = False) -> Step:
        key = (case, level, eager)
        if key not in made:
            path = root / "_".join(str(k) for k in key) if level else None
            made[key] = _step(case, level, path, compiled=not eager)
        return made[key]

    return get


@pytest.mark.parametrize("level", ["L2", "mix"])
@pytest.mark.parametrize("case", CASES)
def test_capture_adds_no_graph_break_or_recompile_and_keeps_the_step_bitwise(edge_step, case,
                                                                             level):
    plain, captured = edge_step(case, None), edge_step(case, level)
    assert plain.stats.get("unique_graphs"), plain.stats     # something was compiled
    if case == "graph_break":
        assert plain.graph_breaks, "the case's graph break did not happen"
    if case == "recompile":
        assert plain.guard_failures, "the second shape did not recompile"
    assert torch.equal(plain.loss, captured.loss)
    assert torch.equal(plain.grads, captured.grads)
    assert captured.graph_breaks == plain.graph_breaks
    assert captured.stats == plain.stats
    assert len(captured.guard_failures) == len(plain.guard_failures), captured.guard_failures
    assert not [r for r in captured.guard_failures if "opdiff" in r], captured.guard_failures


@pytest.mark.parametrize("case", CASES)
def test_a_healthy_pair_against_eager_names_nothing(edge_step, case, tmp_path):
    target, golden = edge_step(case, "L2"), edge_step(case, "L2", eager=True)
    result = opdiff.compare(str(target.path), str(golden.path), str(tmp_path / "out"),
                            progress=False)
    assert result.first_divergence is None, verdict_line(result)
    assert result.counts["error"] == 0
    assert not [n for n in result.notes if n.startswith("inconclusive")], result.notes
    assert result.coverage is not None and result.coverage > 0.7


@pytest.mark.parametrize("level", ["mix", "L2"])
def test_recorded_steps_of_a_compiled_model_compile_once(tmp_path, level):
    torch.manual_seed(0)
    model = Net()
    run = torch.compile(model, backend="aot_eager")
    torch._dynamo.reset()
    counters.clear()
    guard_failures.clear()
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    graphs = []
    for _ in range(3):
        dbg.start(model)
        run(torch.randn(4, 8)).backward()
        dbg.stop()
        dbg.step()
        graphs.append(counters["stats"]["unique_graphs"])
    failures = [r for reasons in guard_failures.values() for r in reasons]
    torch._dynamo.reset()
    assert graphs == [1, 1, 1], failures
    assert not failures
    for s in range(3):      # each step was recorded
        records = (tmp_path / "dump" / f"step{s}" / "rank0" / "records.jsonl").read_text()
        assert '"kind":"aten"' in records or '"kind":"api"' in records
    shutil.rmtree(tmp_path / "dump")
