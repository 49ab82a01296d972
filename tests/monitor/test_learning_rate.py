"""metrics.csv has the learning rate the Monitor's optimizer used at each step (a schedule
shows), and no lr column without an optimizer; trend does not read it as a model number."""
import csv

import torch

import opdiff
from opdiff.trend.layout import IGNORED_COLUMNS


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _csv(path):
    with open(path / "rank0" / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_lr_column_follows_the_schedule(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with opdiff.Monitor(model, tmp_path, optimizer=opt) as mon:
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            mon.step()
            sched.step()
            opt.zero_grad()
    assert [float(r["lr"]) for r in _csv(tmp_path)] == [0.1, 0.05, 0.025]
    assert "lr" in IGNORED_COLUMNS


def test_no_lr_column_without_an_optimizer(tmp_path):
    model = _model()
    with opdiff.Monitor(model, tmp_path) as mon:
        model(torch.randn(3, 4)).sum().backward()
        mon.step()
    assert "lr" not in _csv(tmp_path)[0]
