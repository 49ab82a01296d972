"""Which next step the chain proposes for each kind of open question, from results built by hand
(the end-to-end loops are in test_next_capture.py)."""
from __future__ import annotations

import pytest

from opdiff.comparison.result import CompareResult, Divergence, Note, Origin, TensorRow
from opdiff.config import DumpConfig
from opdiff.explain import evidence_of


def rows(kind="api", mode="tensor", result="pass", n=4, step=3, rank=1, error=0.0):
    out = [TensorRow(f"Torch.exp.{i}.forward.output.0", f"Torch.exp.{i}.forward.output.0",
                     f"Torch.exp.{i}.forward", "output", "forward", kind, i, "float32", "float32",
                     result=result if i == n - 1 else "pass", error=error if i == n - 1 else 0.0,
                     mode=mode, step=step, rank=rank) for i in range(n)]
    return out + [TensorRow("Module.m.M.forward.0.output.0", "Module.m.M.forward.0.output.0",
                            "Module.m.M.forward.0", "output", "forward", "module", n, "float32",
                            "float32", mode=mode, step=step, rank=rank)]


def result(data, fd=None, notes=(), pairs=()):
    return CompareResult("d/t/step3/rank1", "d/g/step3/rank1", data, fd, {}, step=3, rank=1,
                         notes=list(notes), pairs=list(pairs))


def culprit(origin=Origin.OP, step=3):
    return Divergence("Torch.exp.3.forward", "Torch.exp", "forward", "why", None, {}, step=step,
                      rank=1, origin=origin, tensor="w")


UNJUDGED = Note("inconclusive: region 1 could not be judged", Note.INCONCLUSIVE)


@pytest.mark.parametrize("case, verdict, confidence, action, level", [
    ("unjudged at mix", "inconclusive", "none", "capture", "L2"),
    ("unjudged at L1", "inconclusive", "none", "capture", "mix"),
    ("culprit, a region unjudged", "culprit", "probable", "capture", "L2"),
    ("a pair not compared", "inconclusive", "none", "capture", "mix"),
    ("names do not pair", "inconclusive", "none", "map", None),
    ("optimizer", "origin", "confirmed", "capture", "L1"),
    ("collective", "origin", "confirmed", "capture", "mix"),
    ("input", "origin", "confirmed", "inspect", None),
])
def test_the_next_step(case, verdict, confidence, action, level):
    if case == "unjudged at mix":
        r = result(rows(), notes=[UNJUDGED])
    elif case == "unjudged at L1":
        r = result([x for x in rows() if x.kind == "api"], notes=[UNJUDGED])
    elif case == "culprit, a region unjudged":
        r = result(rows(result="error", error=1e-3), culprit(), notes=[UNJUDGED])
    elif case == "a pair not compared":
        r = result(rows(), pairs=[{"step": 3, "rank": 0, "counts": {}},
                                  {"step": 3, "rank": 1, "incomplete": {"side": "golden", "why": "no ops"}}])
    elif case == "names do not pair":
        r = result([TensorRow(f"a.{i}", None, "Torch.exp.0.forward", "output", "forward", "api", i,
                              result="unmatched") for i in range(3)] + rows(n=1))
    else:
        origin = {"optimizer": Origin.OPTIMIZER, "collective": Origin.COLLECTIVE,
                  "input": Origin.INPUT}[case]
        r = result(rows(result="error", error=1e-3), culprit(origin))
    chain = evidence_of(r, output="out")
    nxt = chain["next"]
    assert (chain["verdict"], chain["confidence"], nxt["action"]) == (verdict, confidence, action), case
    if action == "capture":
        config = nxt["config"]
        assert config["level"] == level and config["dump_path"] == "d/t-next"
        loaded = DumpConfig.create(**{k: v for k, v in config.items() if k in ("task", "level", "step",
                                                                               "rank", "dump_path")})
        assert loaded.level == level
        if case == "optimizer":
            assert config["step"] == [2]          # the step before the parameters differed
        elif case == "collective":
            assert config["rank"] == []           # every rank
        elif case == "a pair not compared":
            assert (config["step"], config["rank"]) == ([3], [1])
        assert nxt["commands"][1].startswith("opdiff run --config out/next_capture.json --dump d/t-next")
    if case == "names do not pair":
        assert "--map" in nxt["commands"][0]
