"""Accelerate: a script that trains a model `accelerator.prepare`d on the CPU, with no opdiff
line, run under `opdiff run` (as `python script.py` and inside `accelerate launch`, one process
with a config file written here): the configured steps are recorded with the model found. The
same script with `PrecisionDebugger` on the prepared model records the same ops."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from runkit import run

import opdiff

pytest.importorskip("accelerate")

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 8)), batch_size=4)
    model, opt, data = accelerator.prepare(model, opt, data)
    DEBUGGER
    for (x,) in data:
        START
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        STOP
    torch.save(accelerator.unwrap_model(model).state_dict(), "params.pt")
    print("trained", type(model).__name__)
''')
PLAIN = SCRIPT.replace("DEBUGGER", "").replace("START", "").replace("STOP", "")
IN_SCRIPT = SCRIPT.replace(
    "DEBUGGER", "import opdiff; dbg = opdiff.PrecisionDebugger(dump_path=sys.argv[1], level='mix', step=[0, 1])"
).replace("START", "dbg.start(model)").replace("STOP", "dbg.stop(); dbg.step()")
CONFIG = textwrap.dedent('''
    compute_environment: LOCAL_MACHINE
    distributed_type: 'NO'
    mixed_precision: 'no'
    num_machines: 1
    num_processes: 1
    machine_rank: 0
    use_cpu: true
''')


def _launch(where: Path, args: list, script: str = PLAIN) -> Path:
    where.mkdir()
    (where / "train.py").write_text(script)
    proc = run(args, where, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("opdiff run:")]
    # opdiff's one line says where it wrote; no warning beside it
    under_run = "run" in args
    assert "Traceback" not in proc.stderr and len(said) == under_run, proc.stderr[-3000:]
    assert all(" wrote steps 0,1 " in line for line in said), said
    assert proc.stdout.strip() == "trained Sequential"        # the user's output, untouched
    return where


def _records(dump: Path, step: int) -> list:
    return [json.loads(line) for line in (dump / f"step{step}/rank0/records.jsonl").open()]


def _check_dump(dump: Path) -> None:
    """Steps 0 and 1 of three, each one batch through the prepared model and its optimizer step."""
    assert sorted(p.name for p in dump.iterdir()) == ["step0", "step1"]
    for step in (0, 1):
        records = _records(dump, step)
        forward = [r["op"] for r in records if r.get("phase") == "forward"]
        assert forward.count("Functional.linear") == 2 and forward.count("Functional.gelu") == 1
        # the model is found: its modules and parameters are named from the prepared model down
        assert {"Module.0.Linear", "Module.1.GELU", "Module.2.Linear"} <= set(forward)
        assert "Parameter.0.weight" in forward
        assert any(r["op"] == "Module.0.Linear.parameters_grad" for r in records)


@pytest.fixture(scope="module")
def under_opdiff_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accelerate")
    recorded = _launch(tmp / "run", ["-m", "opdiff", "run", "--dump", "dump", "--steps", "0,1", "--",
                                     "python", "train.py"])
    plain = _launch(tmp / "plain", ["train.py"])
    return recorded, plain


def test_opdiff_run_records_the_configured_steps_of_a_prepared_model(under_opdiff_run):
    recorded, plain = under_opdiff_run
    _check_dump(recorded / "dump")
    a, b = torch.load(recorded / "params.pt"), torch.load(plain / "params.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)          # training is bit for bit the same


def test_precision_debugger_on_the_prepared_model_records_the_same(under_opdiff_run, tmp_path):
    recorded, _ = under_opdiff_run
    in_script = _launch(tmp_path / "in_script", ["train.py", "dump"], script=IN_SCRIPT)
    _check_dump(in_script / "dump")
    result = opdiff.compare(str(in_script / "dump"), str(recorded / "dump"))
    assert result.first_divergence is None and result.counts["unmatched"] == 0, result.verdict
    assert result.counts["pass"] > 20


@pytest.mark.slow
def test_accelerate_launch_runs_opdiff_run_in_its_worker(tmp_path):
    (tmp_path / "accelerate.yaml").write_text(CONFIG)
    launched = _launch(tmp_path / "launched", [
        "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "accelerate.yaml"), "--cpu",
        "--num_processes", "1", "-m", "opdiff", "run", "--dump", "dump", "--steps", "0,1", "--", "train.py"])
    _check_dump(launched / "dump")
