"""The evidence chain in summary.json: on the demo scenarios and on planted faults its culprit is
the first divergence, its facts hold for the rows, and it follows its schema."""
from __future__ import annotations

import pytest

from faultkit import compare, summary, train
from opdiff import schemas
from opdiff.report.summary import load_summary

jsonschema = pytest.importorskip("jsonschema")

# scenario -> (verdict, confidence, next action)
DEMOS = {"iadd": ("culprit", "confirmed", "read_code"),
         "lstm-backward": ("culprit", "confirmed", "read_code"),
         "wrong-weights": ("origin", "confirmed", "inspect"),
         "dropout": ("origin", "confirmed", "inspect"),
         "bf16-healthy": ("no_divergence", "confirmed", "none")}


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    import opdiff.demo
    from rich.console import Console
    import io

    root = tmp_path_factory.mktemp("demos")
    out = {}
    for name in DEMOS:
        console = Console(file=io.StringIO(), width=120)
        out[name] = opdiff.demo.run(name, output=root / name, console=console)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(DEMOS))
def test_the_chain_of_each_demo_names_its_first_divergence(demos, scenario):
    played = demos[scenario]
    doc = summary(played.output)
    schemas.validate("compare-summary", doc)
    chain, first = doc["evidence"], doc["first_divergence"]
    assert (chain["verdict"], chain["confidence"], chain["next"]["action"]) == DEMOS[scenario]
    if first is None:
        assert chain["culprit"] is None and played.expected is None
        assert [f["type"] for f in chain["facts"]] == ["explained"]
        return
    assert chain["culprit"]["name"] == first["name"] == played.culprit
    assert chain["culprit"]["origin"] == first["origin"]
    types = [f["type"] for f in chain["facts"]]
    assert types[0] == "origin_rule" and "output_differs" in types
    differs = next(f for f in chain["facts"] if f["type"] == "output_differs")
    assert differs["worst_ratio"] > 1
    if first["origin"] == "op":       # the culprit's inputs agree within their floor
        agree = next(f for f in chain["facts"] if f["type"] == "inputs_agree")
        assert all(t["ratio"] <= 1 for t in agree["tensors"])
    if first["origin"] == "parameter":
        assert "inputs_differ" in types and chain["next"]["where"]["line"] == first["location"]["line"]


def test_planted_faults_are_the_chain_culprit(tmp_path):
    """A forward fault in three places and a backward one: the chain names each, confirmed,
    with the float64 replay among its facts and the earlier differences (none) cleared."""
    for i, (fault, expected) in enumerate([
            ({"op": "Functional.gelu", "call": 0, "scale": 1.001}, "Functional.gelu.0.forward"),
            ({"op": "Functional.linear", "call": 1, "scale": 1.001}, "Functional.linear.1.forward"),
            ({"op": "Torch.tanh", "call": 0, "scale": 1.001}, "Torch.tanh.0.forward"),
            ({"op": "Functional.gelu", "call": 0, "phase": "backward", "scale": 1.01},
             "Functional.gelu.0.backward")]):
        root = tmp_path / str(i)
        train(root / "golden")
        train(root / "target", fault=fault)
        result = compare(root)
        doc = summary(root / "out")
        schemas.validate("compare-summary", doc)
        chain = doc["evidence"]
        assert result.first_divergence.name == expected == chain["culprit"]["name"], fault
        assert chain["confidence"] == "confirmed" and chain["next"]["action"] == "read_code"
        assert "replay" in [f["type"] for f in chain["facts"]]


def test_an_older_summary_without_evidence_is_explained_from_its_rows(tmp_path):
    import json

    from opdiff.cli import main

    train(tmp_path / "golden")
    train(tmp_path / "target", fault={"op": "Functional.gelu", "call": 0, "scale": 1.001})
    compare(tmp_path)
    path = tmp_path / "out" / "summary.json"
    doc = json.loads(path.read_text())
    written = doc.pop("evidence")
    path.write_text(json.dumps(doc))
    from opdiff.explain import evidence_of
    again = evidence_of(load_summary(path), output=str(tmp_path / "out"))
    assert again["culprit"] == written["culprit"] and again["verdict"] == written["verdict"]
    assert main(["explain", str(tmp_path / "out"), "--json"]) == 0


def test_every_rank_that_differs_is_in_the_chain(tmp_path):
    """Three ranks, faults on ranks 1 and 2: the chain names the first divergence and lists
    both faulty ranks' own, so that a second rank is never silently left out."""
    import sys
    from pathlib import Path

    import opdiff

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
    try:
        from rank_dumps import dump_ranks
    finally:
        sys.path.pop(0)
    dump_ranks(tmp_path / "target", task="tensor", ranks=3, faulty={1, 2}, own_inputs=True)
    dump_ranks(tmp_path / "golden", task="tensor", ranks=3, own_inputs=True)
    result = opdiff.compare(tmp_path / "target", tmp_path / "golden", output_path=tmp_path / "out",
                            progress=False)
    doc = summary(tmp_path / "out")
    schemas.validate("compare-summary", doc)
    chain = doc["evidence"]
    assert chain["culprit"]["name"] == result.first_divergence.name
    pairs = next(f for f in chain["facts"] if f["type"] == "pairs")
    assert [p["rank"] for p in pairs["pairs"]] == [1, 2]
    assert all(p["first_divergence"] == chain["culprit"]["name"] for p in pairs["pairs"])
