"""Tiny models of the seeds' families: a 3D-ResNet (seed 000), an LSTM (001), a 2D ResNet (003)."""
import torch
import torch.nn as nn


class BasicBlock3d(nn.Module):
    """3D-ResNet basic block, written the way the seed 000 user's code is."""

    def __init__(self, planes, downsample=None, in_planes=None):
        super().__init__()
        in_planes = in_planes or planes
        self.conv1 = nn.Conv3d(in_planes, planes, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm3d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv3d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm3d(planes)
        self.downsample = downsample

    def forward(self, x):
        residual = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            residual = self.downsample(x)

        out += residual    # the seed's problem line
        out = self.relu(out)
        return out


class ResNet3d(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.stem = nn.Conv3d(1, 4, 3, padding=1, bias=False)
        self.layer1 = nn.Sequential(BasicBlock3d(4), BasicBlock3d(4))
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        x = self.layer1(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class LstmNet(nn.Module):
    def __init__(self, features=6, hidden=8, classes=3):
        super().__init__()
        self.proj = nn.Linear(features, hidden)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(torch.tanh(self.proj(x)))
        return self.head(out[:, -1])


class BasicBlock2d(nn.Module):
    def __init__(self, planes):
        super().__init__()
        self.conv1 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


class ResNet2d(nn.Module):
    """ResNet-style CNN, small enough that its full tensors fit a JSON .pkl quickly."""

    def __init__(self, classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.layer1 = nn.Sequential(BasicBlock2d(8), BasicBlock2d(8))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))
