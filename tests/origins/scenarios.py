"""Small runs dumped in their own process by the origins tests:

    python scenarios.py SIDE ROOT CASE[,CASE...] TASK[,TASK...]

writes ROOT/TASK/CASE for each. SIDE "golden" is the healthy run of the case's family (cnn,
block, lstm, llama: a Hugging Face Llama from a tiny config); "target" carries the difference the
CASE names (cnn-element: one weight element off by 1e-2, -layer: a layer re-initialised, -seed:
weights from another seed, -buffer: a BatchNorm running mean, -input: one input element (a token
id for llama), -random: the generator reseeded after building, -fault: a kernel fault planted
with opdiff.testing.inject_fault)."""
from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn as nn

import opdiff
import opdiff.testing


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


class Recurrent(nn.Module):
    """A sequence classifier around nn.LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 16)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(torch.tanh(self.proj(x)))
        return self.head(out[:, -1])


def llama() -> nn.Module:
    """A Hugging Face Llama built from a tiny config (nothing downloaded)."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaModel(cfg)


# family -> (model, input, the parameter its "-element" case spoils)
FAMILIES = {
    "cnn": (CNN, lambda: torch.randn(2, 3, 8, 8), "conv2.weight"),
    "block": (Block, lambda: torch.randn(2, 6, 32), "mlp.2.weight"),
    "lstm": (Recurrent, lambda: torch.randn(2, 5, 6), "lstm.weight_hh_l0"),
    "llama": (llama, lambda: torch.randint(0, 64, (2, 8)), "layers.0.mlp.up_proj.weight"),
}
# "-fault" cases: a kernel fault planted with opdiff.testing.inject_fault (origin op)
FAULTS = {
    "cnn": dict(op="Functional.conv2d", call=1, phase="forward", scale=1 + 1e-3),
    "block": dict(op="Functional.gelu", call=0, phase="forward", scale=1 + 1e-3),
    "lstm": dict(op="VF.lstm", call=0, phase="forward", scale=1 + 1e-3),
    "llama": dict(op="Functional.silu", call=0, phase="forward", scale=1 + 1e-3),
}


def build(case: str, side: str) -> tuple[nn.Module, torch.Tensor]:
    family = case.split("-")[0]
    make, data, spoiled = FAMILIES[family]
    seed = 1 if (side == "target" and case.endswith("seed")) else 0
    torch.manual_seed(seed)
    model: nn.Module = make()
    torch.manual_seed(100)
    x = data()
    if side != "target":
        return model, x
    with torch.no_grad():
        if case.endswith("element"):
            model.get_parameter(spoiled).view(-1)[5] += 1e-2
        elif case.endswith("layer"):
            torch.manual_seed(7)
            layer = model.conv2 if family == "cnn" else model.mlp[0]
            layer.reset_parameters()
        elif case.endswith("buffer"):
            model.bn1.running_mean[3] += 0.5     # type: ignore[index]
        elif case.endswith("input"):
            x = x.clone()
            if x.is_floating_point():
                x.view(-1)[7] += 0.25
            else:                               # a token id
                x.view(-1)[7] = (x.view(-1)[7] + 1) % 64
        elif case.endswith("random"):
            torch.manual_seed(12345)
    return model, x


def dump_case(case: str, side: str, dump: str, task: str, level: str = "mix") -> None:
    """Build, run forward and backward once, recorded into `dump`."""
    model, x = build(case, side)
    if case.endswith("buffer") or (case.startswith(("block", "llama"))
                                   and not case.endswith("random")):
        model.eval()
    fault = FAULTS.get(case.split("-")[0]) if side == "target" and case.endswith("fault") else None
    planted = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with planted, opdiff.dump(model, dump, level=level, task=task):
        out = model(x)
        out = out if isinstance(out, torch.Tensor) else out.last_hidden_state
        out.float().pow(2).mean().backward()
    if fault and planted.hits != 1:
        raise RuntimeError(f"the fault on {fault['op']} fired {planted.hits} times, not once")


if __name__ == "__main__":
    side, root = sys.argv[1], sys.argv[2]
    for task in sys.argv[4].split(","):
        for case in sys.argv[3].split(","):
            dump_case(case, side, f"{root}/{task}/{case}", task)
