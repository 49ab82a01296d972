"""Make the msprobe fixtures under tests/data/msprobe/ (run once, by hand; the output is committed).

msprobe must live in its own virtual environment so the system torch stays untouched:

    python -m venv --system-site-packages /tmp/msprobe-venv
    /tmp/msprobe-venv/bin/pip install mindstudio-probe          # 26.2.0 was used
    /tmp/msprobe-venv/bin/python tests/data/make_fixtures/make_msprobe_fixtures.py

It runs one training step of a tiny CNN (a residual block with `out += residual`) followed by
an LSTM, on CPU, under msprobe's PrecisionDebugger at level mix, twice per task:

- golden: plain fp32;
- target: the same weights and input, but the output of the first `Tensor.__iadd__` call (the
  residual add) is scaled by (1 + 1e-3) inside the op, so msprobe records the fault as that
  op's output.

for task=statistics and task=tensor. Then it runs msprobe's own compare on the tensor pair and
keeps its CSV (the agreement test checks opdiff's metrics against it).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "msprobe"
FAULT = 1e-3


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        residual = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out += residual
        out = self.relu(out)
        return out


class Net(nn.Module):
    def __init__(self, c=4, hidden=4, classes=3):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.block = Block(c)
        self.lstm = nn.LSTM(c, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        out = self.block(self.stem(x))
        seq = out.flatten(2).transpose(1, 2)          # (batch, H*W, c)
        seq, _ = self.lstm(seq)
        return self.fc(seq[:, -1])


def plant_fault():
    """Scale the first residual add's result by (1 + FAULT), inside the op msprobe wraps."""
    original = torch.Tensor.__iadd__
    calls = {"n": 0}

    def faulty_iadd(self, other):
        result = original(self, other)
        calls["n"] += 1
        if calls["n"] == 1:
            # TensorBase methods are not wrapped by msprobe, so this adds no op to the dump.
            torch._C.TensorBase.mul_(result, 1.0 + FAULT)
        return result

    torch.Tensor.__iadd__ = faulty_iadd


def run_one(side: str, task: str, dump_path: Path) -> None:
    """Child process: one step of Net under msprobe."""
    if side == "target":
        plant_fault()  # before msprobe wraps torch.Tensor, so msprobe wraps the faulty op
    from msprobe.pytorch import PrecisionDebugger, seed_all

    seed_all(1234)
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(2, 3, 4, 4)
    y = torch.tensor([0, 2])
    config = {
        "task": task, "dump_path": str(dump_path), "rank": [], "step": [0], "level": "mix",
        "extra_info": True, "async_dump": False,
        task: {"scope": [], "list": [], "data_mode": ["all"]},
    }
    import json
    cfg = dump_path.parent / f"config_{side}_{task}.json"
    cfg.write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(cfg))
    debugger.start(model)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    debugger.stop()
    debugger.step()
    print(f"{side}/{task}: loss={loss.item():.6f}")


def main() -> None:
    if len(sys.argv) == 4:
        run_one(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
        return
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="msprobe_fixtures_"))
    for task in ("statistics", "tensor"):
        for side in ("golden", "target"):
            dump = work / task / side
            dump.mkdir(parents=True)
            subprocess.run([sys.executable, __file__, side, task, str(dump)], check=True)
            # A run without torch.distributed writes step0/proc{pid}; name it rank0 so the
            # fixture paths are stable (the reader handles proc{pid} directories too).
            for proc in glob.glob(str(dump / "step*" / "proc*")):
                os.rename(proc, Path(proc).parent / "rank0")
            shutil.copytree(dump, OUT / task / side)

    # msprobe's own compare of the tensor pair (target = "NPU", golden = "Bench").
    cmp_out = work / "compare"
    subprocess.run([str(Path(sys.executable).parent / "msprobe"), "compare",
                    "-tp", str(OUT / "tensor/target/step0/rank0/dump.json"),
                    "-gp", str(OUT / "tensor/golden/step0/rank0/dump.json"),
                    "-o", str(cmp_out)], check=True)
    csvs = sorted(cmp_out.glob("compare_result_*.csv"))
    shutil.copy(csvs[-1], OUT / "tensor" / "msprobe_compare_result.csv")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
