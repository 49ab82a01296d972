"""The skill shipped for coding agents: `opdiff skill` prints it, `--install` writes it where an
agent looks, and every command in it runs: its fenced commands, in order, on a tiny training
script with a planted fault, end with the culprit confirmed."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from opdiff.cli import COMMANDS, build_parser, main
from opdiff.explain.skill import skill_text

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(opdiff [^`]+)`")

# The suspect run (`python train.py`) scales one op's output by 1+1e-3; the reference does not.
TRAIN = '''
import sys
import torch
import opdiff
from opdiff.testing import inject_fault

opdiff.seed_all(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randn(32, 4)
fault = None if "--reference" in sys.argv else inject_fault("Functional.gelu", call=None, scale=1.001)
if fault is not None:
    fault.__enter__()
for step in range(2):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
'''


def fenced_commands(text: str) -> list[str]:
    return [line.strip() for block in FENCE.findall(text) for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_the_skill_has_front_matter_an_agent_reads():
    text = skill_text()
    head = text.split("---")[1]
    fields = dict(line.split(": ", 1) for line in head.strip().splitlines())
    assert fields["name"] == "opdiff" and len(fields["description"]) > 80
    assert "## Never conclude" in text
    for word in ("verdict", "confidence", "next", "inputs_agree", "upstream_cleared", "ratio"):
        assert f"`{word}`" in text, word


def test_every_inline_command_of_the_skill_parses():
    lines = INLINE.findall(skill_text()) + fenced_commands(skill_text())
    assert len(lines) > 12
    for line in lines:
        argv = shlex.split(line)[1:]
        if len(argv) == 1 and not argv[0].startswith("-"):      # a command named in prose
            assert argv[0] in COMMANDS, line
            continue
        assert build_parser().parse_args(argv).run is not None, line


def test_print_and_install(tmp_path, capsys):
    assert main(["skill"]) == 0
    assert capsys.readouterr().out == skill_text()
    skills = tmp_path / ".claude" / "skills"
    assert main(["skill", "--install", str(skills)]) == 0
    path = skills / "opdiff" / "SKILL.md"
    assert path.read_text(encoding="utf-8") == skill_text()
    assert main(["skill", "--install", str(skills)]) == 0 and "up to date" in capsys.readouterr().out
    path.write_text("mine")
    assert main(["skill", "--install", str(skills)]) == 2
    assert path.read_text() == "mine"
    assert main(["skill", "--install", str(skills), "--force"]) == 0
    assert path.read_text(encoding="utf-8") == skill_text()


@pytest.mark.slow
def test_every_fenced_command_of_the_skill_runs_and_ends_confirmed(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    commands = fenced_commands(skill_text())
    assert len(commands) >= 10 and all(c.startswith("opdiff ") for c in commands)
    outputs = {}
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        outputs[command] = proc.stdout
    first = json.loads(outputs["opdiff explain out --json"])
    assert first["culprit"]["name"] == "Functional.gelu.0.forward"
    assert (first["confidence"], first["next"]["action"]) == ("probable", "capture")
    assert outputs["opdiff query out --result warning --count"].strip().isdigit()
    assert "Functional.gelu.0.forward" in outputs["opdiff query out 'result == \"error\"'"]
    last = json.loads((tmp_path / "out-next" / "summary.json").read_text())["evidence"]
    assert last["culprit"]["name"] == "Functional.gelu.0.forward"
    assert last["confidence"] == "confirmed"
    assert outputs["opdiff explain out-next"].startswith("culprit (confirmed): Functional.gelu.0.forward")
