"""Origins in two more families, an LSTM and a Hugging Face Llama built from a tiny config: one
weight element spoiled by 1e-2 (origin parameter, its FQN, the first op that reads it), one input
element changed (origin input), and a planted kernel fault (still origin op, as in the CNN and
the transformer block of test_origins.py), with statistics and tensor dumps. Golden and target are dumped in two processes (scenarios.py) and compared
through the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opdiff.cli import main

pytest.importorskip("transformers")

HERE = Path(__file__).parent
TASKS = ("tensor", "statistics")
# case -> (origin, tensor (None: the op's own), the first op that reads it, the file it is in)
CASES = {
    "cnn-fault": ("op", None, "Functional.conv2d.1.forward", "scenarios.py"),
    "block-fault": ("op", None, "Functional.gelu.0.forward", "scenarios.py"),
    "lstm-element": ("parameter", "lstm.weight_hh_l0", "VF.lstm.0.forward", "scenarios.py"),
    "lstm-input": ("input", "0", "Module.proj.Linear.forward.0", "scenarios.py"),
    "lstm-fault": ("op", None, "VF.lstm.0.forward", "scenarios.py"),
    "llama-element": ("parameter", "layers.0.mlp.up_proj.weight", "Functional.linear.5.forward",
                      "modeling_llama.py"),
    "llama-input": ("input", "0", "Module.embed_tokens.Embedding.forward.0", "modeling_llama.py"),
    "llama-fault": ("op", None, "Functional.silu.0.forward", "activations.py"),
}
FAMILIES = ("cnn", "block", "lstm", "llama")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    """Golden and target dumped by two processes, at once."""
    root = tmp_path_factory.mktemp("families")
    procs = [subprocess.Popen([sys.executable, str(HERE / "scenarios.py"), side, str(root / side),
                               ",".join(cases), ",".join(TASKS)])
             for side, cases in (("golden", FAMILIES), ("target", list(CASES)))]
    try:
        assert [p.wait(timeout=600) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return root


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("case", list(CASES))
def test_origin_named(dumps, tmp_path, case, task):
    origin, tensor, reader, where = CASES[case]
    rc = main(["compare", str(dumps / "target" / task / case),
               str(dumps / "golden" / task / case.split("-")[0]), "-o", str(tmp_path),
               "--no-progress", "--fail-on-divergence"])
    fd = json.loads((tmp_path / "summary.json").read_text())["first_divergence"]
    assert rc == 1
    assert (fd["origin"], fd["name"]) == (origin, reader), fd["reason"]
    assert fd["step"] == 0 and fd["rank"] == 0
    assert Path(fd["location"]["file"]).name == where
    if tensor is not None:
        assert fd["tensor"] == tensor
        assert "differs before any op uses it" in fd["reason"]
    else:       # the op's own error: its inputs agree
        assert fd["tensor"].startswith(f"{reader}.output")
        assert "inputs agree" in fd["reason"] or "inputs' statistics agree" in fd["reason"]


@pytest.mark.slow
def test_healthy_runs_name_no_origin(dumps, tmp_path):
    for task in TASKS:
        for family in ("lstm", "llama"):        # (cnn, block: test_origins.py)
            golden = dumps / "golden" / task / family
            assert main(["compare", str(golden), str(golden), "-o", str(tmp_path / task / family),
                         "--no-progress", "--fail-on-divergence"]) == 0
