"""Tiny real models for replay tests (the same three as tests/compare/test_real_models.py):
a residual CNN with BatchNorm, an LSTM and a 2-layer transformer encoder, one training step."""
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import opdiff
import opdiff.testing


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        residual = x
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += residual
        return F.relu(out)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.b1, self.b2 = Block(8), Block(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.b2(self.b1(F.relu(self.stem(x)))).mean((2, 3)))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(16, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.layer2 = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.layer2(self.layer(self.emb(x))).mean(1))


def make(name):
    torch.manual_seed(0)
    if name == "cnn":
        return CNN(), torch.randn(2, 3, 12, 12)
    if name == "lstm":
        return LSTMNet(), torch.randn(2, 6, 8)
    return Transformer(), torch.randn(2, 6, 16)


def run(name, path, bf16=False, fault=None, task="tensor"):
    """One forward+backward step dumped at level mix; bf16: autocast (LSTM: the model in bf16,
    CPU autocast has no bf16 LSTM); fault: inject_fault keyword arguments."""
    model, x = make(name)
    cast = bf16 and name == "lstm"
    if cast:
        model, x = model.bfloat16(), x.bfloat16()
    ctx = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with ctx, opdiff.dump(model, path, level="mix", task=task):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and not cast):
            out = model(x)
        out.float().pow(2).mean().backward()


class Fp32AccumulatingKernels(TorchFunctionMode):
    """Another device's healthy bf16 kernels: under autocast, conv2d and linear compute in fp32
    and round the output to bf16 (CPU's bf16 kernels give slightly different numbers).
    Enter it before the dump so the recorder sees these kernels as the ops' own."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.conv2d, F.linear) and torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                up = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
                kw = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
                return func(*up, **kw).bfloat16()
        return func(*args, **kwargs)
