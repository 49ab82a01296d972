"""Small runs dumped in their own process by the origins tests:

    python scenarios.py SIDE ROOT CASE[,CASE...] TASK[,TASK...]

writes ROOT/TASK/CASE for each. SIDE "golden" is the healthy run of the case's family (cnn,
block); "target" carries the difference the CASE names (cnn-element: one weight element off by
1e-2, -layer: a layer re-initialised, -seed: weights from another seed, -buffer: a BatchNorm
running mean, -input: one input element, -random: the generator reseeded after building)."""
from __future__ import annotations

import sys

import torch
import torch.nn as nn

import opdiff


class CNN(nn.Module):
    """A small CNN with BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.head(x.flatten(1))


class Block(nn.Module):
    """A transformer block with dropout."""

    def __init__(self, width: int = 32, p: float = 0.1) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, 4, dropout=p, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.GELU(), nn.Linear(64, width))
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.drop(self.mlp(self.norm(x)))


def build(case: str, side: str) -> tuple[nn.Module, torch.Tensor]:
    family = "cnn" if case.startswith("cnn") else "block"
    seed = 1 if (side == "target" and case.endswith("seed")) else 0
    torch.manual_seed(seed)
    model: nn.Module = CNN() if family == "cnn" else Block()
    torch.manual_seed(100)
    x = torch.randn(2, 3, 8, 8) if family == "cnn" else torch.randn(2, 6, 32)
    if side != "target":
        return model, x
    with torch.no_grad():
        if case.endswith("element"):
            name = "conv2.weight" if family == "cnn" else "mlp.2.weight"
            model.get_parameter(name).view(-1)[5] += 1e-2
        elif case.endswith("layer"):
            torch.manual_seed(7)
            layer = model.conv2 if family == "cnn" else model.mlp[0]
            layer.reset_parameters()
        elif case.endswith("buffer"):
            model.bn1.running_mean[3] += 0.5     # type: ignore[index]
        elif case.endswith("input"):
            x = x.clone()
            x.view(-1)[7] += 0.25
        elif case.endswith("random"):
            torch.manual_seed(12345)
    return model, x


def dump_case(case: str, side: str, dump: str, task: str, level: str = "mix") -> None:
    """Build, run forward and backward once, recorded into `dump`."""
    model, x = build(case, side)
    if case.endswith("buffer") or (case.startswith("block") and not case.endswith("random")):
        model.eval()
    with opdiff.dump(model, dump, level=level, task=task):
        out = model(x)
        out.float().pow(2).mean().backward()


if __name__ == "__main__":
    side, root = sys.argv[1], sys.argv[2]
    for task in sys.argv[4].split(","):
        for case in sys.argv[3].split(","):
            dump_case(case, side, f"{root}/{task}/{case}", task)
