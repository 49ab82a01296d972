"""The demo's models: tiny members of the seed documents' model families.

They are ordinary PyTorch code on purpose: opdiff records them like any user model, so the
culprit's location points into this file (the 3D-ResNet block's `out += residual` line, the
hand-written softmax's `torch.exp` line), exactly as it would point into the user's own code.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..store.frames import register_user_code

# The demo stands in for the user's code: capture names its `+=` and points at its lines, as
# it would in the user's own files (registered here, where the models are, so that
# `opdiff demo --list` need not load the store).
register_user_code(os.path.dirname(os.path.abspath(__file__)))


class BasicBlock3d(nn.Module):
    """3D-ResNet basic block, written the way seed 000's user wrote it."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv3d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm3d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv3d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm3d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv3d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm3d(planes))

    def forward(self, x):
        residual = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            residual = self.downsample(x)

        out += residual
        out = self.relu(out)
        return out


class ScaledSoftmax(nn.Module):
    """Softmax written out by hand with a CLIP-style logit scale.

    Fine in fp32 (exp(50) is 5e21); in fp16 exp overflows once its argument passes 11.1.
    """

    def __init__(self, scale: float = 100.0):
        super().__init__()
        self.scale = scale

    def forward(self, logits):
        e = torch.exp(logits * self.scale)
        return e / e.sum(dim=-1, keepdim=True)


class ResNet3d(nn.Module):
    """A 3D-ResNet (seed 000's family) shrunk to run a training step in a fraction of a second.

    blocks: residual blocks at width `width`, then one that doubles the width with a
    downsample shortcut. With `softmax_scale`, the model returns probabilities computed by
    `ScaledSoftmax` instead of logits.
    """

    def __init__(self, in_channels: int = 3, width: int = 8, blocks: int = 2, classes: int = 4,
                 softmax_scale: float | None = None):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv3d(in_channels, width, 3, stride=(1, 2, 2), padding=1, bias=False),
            nn.BatchNorm3d(width), nn.ReLU(inplace=True))
        layers = [BasicBlock3d(width, width) for _ in range(blocks)]
        layers.append(BasicBlock3d(width, 2 * width, stride=2))
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(2 * width, classes)
        self.softmax = ScaledSoftmax(softmax_scale) if softmax_scale else None

    def forward(self, x):
        x = self.layers(self.stem(x))
        logits = self.fc(torch.flatten(self.pool(x), 1))
        return self.softmax(logits) if self.softmax is not None else logits


class LstmClassifier(nn.Module):
    """A sequence classifier around nn.LSTM (the op seed 001's user found broken in backward)."""

    def __init__(self, features: int = 6, hidden: int = 16, classes: int = 4):
        super().__init__()
        self.proj = nn.Linear(features, hidden)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(torch.tanh(self.proj(x)))
        return self.head(out[:, -1])


class DropoutClassifier(nn.Module):
    """A small classifier with dropout between its layers (active while training)."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4, p: float = 0.2):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        hidden = torch.relu(self.fc1(x))
        return self.fc2(self.drop(hidden))


def classification_loss(output, labels, probabilities: bool = False):
    """Cross-entropy on logits, or negative log-likelihood on probabilities (computed in fp32)."""
    if probabilities:
        return F.nll_loss(torch.log(output.float()), labels)
    return F.cross_entropy(output.float(), labels)
