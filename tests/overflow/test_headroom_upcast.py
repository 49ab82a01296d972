"""In an fp16 run, a norm that upcasts to float32 on purpose is not told its float32 values
"would overflow in fp16": they never were going to be fp16. fp16 outputs near their limit
still are; a float32 run still hears which ops would overflow in fp16."""
import torch
from torch import nn

import opdiff
from opdiff.overflow import analyze


class UpcastNorm(nn.Module):
    """RMSNorm as LLMs write it: computed in float32, returned in the input's dtype."""

    def forward(self, x):
        h = x.float()
        var = h.pow(2).mean(-1, keepdim=True)       # 400**2 = 1.6e5: beyond fp16, in fp32
        return (h * torch.rsqrt(var + 1e-6)).to(x.dtype)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = UpcastNorm()

    def forward(self, x):
        return self.norm(x) * 1.0 + x * 100.0      # x * 100 = 4e4: within 2x of fp16's max


def _warned(tmp_path, dtype):
    x = torch.full((2, 8), 400.0, dtype=dtype)
    path = tmp_path / str(dtype)
    net = Net()
    with opdiff.dump(net, str(path), level="mix"):
        net(x)
    return {w.name.split(".")[1]: w for w in analyze(path).headroom}


def test_fp16_run_upcasting_norm_is_not_warned(tmp_path):
    warned = _warned(tmp_path, torch.float16)
    assert "pow" not in warned and "mean" not in warned, list(warned)
    mul = [w for w in warned.values() if w.dtype == "float16"]
    assert mul, "the fp16 op near its own limit is still warned"


def test_fp32_run_still_hears_what_would_overflow_in_fp16(tmp_path):
    assert "pow" in _warned(tmp_path, torch.float32)
