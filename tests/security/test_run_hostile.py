"""`opdiff run` in the user's training process: a control file that is a FIFO or a link to
/dev/zero neither hangs training nor grows it nor turns capture off, and the interpreter options
the user gave (`-O`, `-OO`, `-B`, `-s`, `-W`, `-X`) are the ones the script runs under (real
`opdiff run` processes, with a time limit and an address-space limit)."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from runkit import environment

TRAIN = textwrap.dedent("""
    import json, sys, warnings, torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    asserts_on = True
    try:
        assert False
    except AssertionError:
        pass
    else:
        asserts_on = False
    f = sys.flags
    print(json.dumps({"optimize": f.optimize, "dont_write_bytecode": f.dont_write_bytecode,
                      "no_user_site": f.no_user_site, "dev_mode": f.dev_mode,
                      "asserts": asserts_on, "docstrings": train.__doc__ is not None,
                      "warnings": [str(w) for w in sys.warnoptions]}))
""")
TRAIN = '"""doc"""\n' + TRAIN.replace("train.__doc__", "__doc__")


def _limit_memory():          # a runaway read ends in MemoryError, not in a swapping machine
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def opdiff_run(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(TRAIN)
    try:
        return subprocess.run([sys.executable, "-m", "opdiff", "run", *args], cwd=tmp_path,
                              env=environment(), capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"opdiff run did not end in {timeout} s (training hung): {exc.stderr!r}")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_hostile_control_file_neither_hangs_nor_grows_training(tmp_path, kind):
    control = tmp_path / "control.json"
    if kind == "fifo":
        os.mkfifo(control)
    elif kind == "dev-zero":
        control.symlink_to("/dev/zero")
    else:
        control.write_bytes(b'{"steps": [' + b"0, " * (1 << 20) + b"1]}")
    proc = opdiff_run(tmp_path, "--dump", "d", "--steps", "0-2", "--control", str(control),
                      "--", sys.executable, "train.py", timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "control file" in line]
    assert len(said) == 1, proc.stderr                      # said once, in one line
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    # capture stayed on: the configured steps were recorded
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["step0", "step1", "step2"]


@pytest.mark.slow
@pytest.mark.parametrize("options", [["-O"], ["-OO", "-B", "-s"],
                                     ["-W", "error::UserWarning", "-X", "dev"]])
def test_the_interpreter_options_reach_the_script(tmp_path, options):
    (tmp_path / "train.py").write_text(TRAIN)
    plain = subprocess.run([sys.executable, *options, "train.py"], cwd=tmp_path, env=environment(),
                           capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0, plain.stderr
    proc = opdiff_run(tmp_path, "--dump", "d", "--", sys.executable, *options, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == json.loads(plain.stdout.splitlines()[-1])
    assert (tmp_path / "d" / "step0").is_dir()              # and it was captured


@pytest.mark.parametrize("option", ["-E", "-I", "-S", "-OE"])
def test_an_option_that_skips_opdiffs_start_up_is_one_line(tmp_path, option):
    proc = opdiff_run(tmp_path, "--dump", "d", "--", sys.executable, option, "train.py")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing would be captured" in lines[0], proc.stderr
    assert not (tmp_path / "d").exists()
