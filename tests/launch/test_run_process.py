"""`opdiff run -- CMD` leaves the program its own: exit status, arguments, stdin/stdout, its
exceptions (printed from its own frames) and signals; a command that cannot run is one line and
exit 2. Training under it is bit for bit the training without it, and the configured steps are
dumped."""
from __future__ import annotations

import json
import signal
import textwrap

import pytest
from runkit import run


def _script(tmp_path, name: str, text: str) -> str:
    (tmp_path / name).write_text(textwrap.dedent(text))
    return name


def test_a_command_that_cannot_run_is_one_line_and_exit_2(opdiff_run):
    proc = opdiff_run("--dump", "d", "--", "no-such-command-opdiff-test", "x")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-command-opdiff-test" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_options_and_missing_script_are_one_line(opdiff_run):
    proc = opdiff_run("--", "python", "train.py")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--dump" in proc.stderr
    proc = opdiff_run("--dump", "d", "--", "python", "missing_script.py")
    assert proc.returncode == 2 and "missing_script.py" in proc.stderr and "Traceback" not in proc.stderr
    proc = opdiff_run("--config", "no_such.json", "--", "python", "train.py")
    assert proc.returncode == 2 and "no_such.json" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = opdiff_run("--dump", "d", "--steps", "x-1", "--", "python", "train.py")
    assert proc.returncode == 2 and "--steps" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_arguments_stdin_and_stdout_are_the_programs(tmp_path, opdiff_run):
    name = _script(tmp_path, "echo.py", """
        import sys, json
        print(json.dumps({"argv": sys.argv, "stdin": sys.stdin.read(), "path0": sys.path[0]}))
    """)
    for cmd in (["python", name], [name]):
        proc = opdiff_run("--dump", "d", "--", *cmd, "--lr", "3e-4", "a b", input="hello\n")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["argv"] == [name, "--lr", "3e-4", "a b"] and out["stdin"] == "hello\n"
        assert out["path0"] == str(tmp_path)
        assert proc.stderr == ""


def test_a_script_that_raises_shows_its_traceback_only_and_exits_1(tmp_path, opdiff_run):
    name = _script(tmp_path, "boom.py", """
        def train():
            raise ValueError("bad batch")
        train()
    """)
    proc = opdiff_run("--dump", "d", "--", "python", name)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last):"), proc.stderr
    assert 'boom.py", line 4' in proc.stderr and "ValueError: bad batch" in proc.stderr
    assert "opdiff" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr


def test_exit_status_and_signal_are_the_programs(tmp_path, opdiff_run):
    _script(tmp_path, "three.py", "import sys; print('out'); sys.exit(3)\n")
    proc = opdiff_run("--dump", "d", "--", "python", "three.py")
    assert (proc.returncode, proc.stdout) == (3, "out\n")
    _script(tmp_path, "message.py", "import sys; sys.exit('stopped early')\n")
    proc = opdiff_run("--dump", "d", "--", "python", "message.py")
    assert (proc.returncode, proc.stderr) == (1, "stopped early\n")
    _script(tmp_path, "term.py", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)\n")
    proc = opdiff_run("--dump", "d", "--", "python", "term.py")
    assert proc.returncode == -signal.SIGTERM
    # a command that is not a Python script replaces opdiff run: its status is its own too
    proc = opdiff_run("--dump", "d", "--", "sh", "-c", "echo shell; exit 4")
    assert (proc.returncode, proc.stdout) == (4, "shell\n")


TRAIN = """
    import sys, torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(4):
        x = torch.randn(4, 8)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch.save(model.state_dict(), sys.argv[1])
"""


@pytest.mark.slow
def test_configured_steps_are_dumped_and_training_is_bitwise_the_same(tmp_path, opdiff_run):
    import torch

    _script(tmp_path, "train.py", TRAIN)
    plain = run(["train.py", "plain.pt"], tmp_path)
    assert plain.returncode == 0, plain.stderr
    proc = opdiff_run("--dump", "dump", "--task", "tensor", "--steps", "0,2", "--", "python", "train.py", "run.pt")
    # the one line opdiff adds: where it wrote, and what to do with it
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (f"opdiff run: wrote steps 0,2 (every rank) to {tmp_path / 'dump'}; "
                           f"compare it with: opdiff compare dump OTHER_DUMP\n"), proc.stderr
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step0", "step2"]
    a, b = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "run.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rank = tmp_path / "dump/step2/rank0"
    records = [json.loads(line) for line in (rank / "records.jsonl").open()]
    forward = [r["op"] for r in records if r.get("phase") == "forward"]
    # the step runs from the first forward to the optimizer's step, both included
    assert forward.count("Functional.linear") == 2 and "Functional.gelu" in forward
    assert any(op.startswith("Module.") for op in forward)
    stacks = {s["id"]: s["frames"][0]["code"] for s in map(json.loads, (rank / "stacks.jsonl").open())}
    assert stacks[records[-1]["stack"]] == "opt.step()"
    # --monitor: opdiff.Monitor on every step, training still bit for bit the same
    proc = opdiff_run("--monitor", "mon", "--", "python", "train.py", "mon.pt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (f"opdiff run: monitored into {tmp_path / 'mon'}; "
                           f"read it with: opdiff trend mon -o OUT\n"), proc.stderr
    rows = (tmp_path / "mon/rank0/metrics.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["0", "1", "2", "3"]
    assert "0:fwd_norm" in rows[0] and "grad_norm" in rows[0]
    c = torch.load(tmp_path / "mon.pt")
    assert all(torch.equal(a[k], c[k]) for k in a)
