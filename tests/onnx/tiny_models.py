"""Tiny models for the ONNX tests; also a `--torch FILE:FUNCTION` target (build_model)."""
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class TinyCNN(nn.Module):
    """Conv-BN-ReLU x2, pooling, Linear-GELU-Linear, softmax: the shapes users export."""

    def __init__(self):
        super().__init__()
        self.stem = Block(3, 8)
        self.layer1 = nn.Sequential(Block(8, 8))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(8, 16)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        x = self.pool(self.layer1(self.stem(x))).flatten(1)
        return torch.softmax(self.fc2(self.gelu(self.fc1(x))), -1)


def build_model():
    torch.manual_seed(0)
    model = TinyCNN().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics, so folding BN matters
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model


def build_with_example():
    torch.manual_seed(1)
    return build_model(), (torch.randn(2, 3, 16, 16),)


FP16_MAX = 65504.0


def export_ts(model, path, batch_dynamic=True):
    import torch

    x = torch.randn(1, 3, 16, 16)
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["probs"],
                      dynamic_axes={"input": {0: "batch"}} if batch_dynamic else None)
    return path
