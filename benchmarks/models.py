"""The benchmark workloads (DESIGN.md "How good is good"): a ResNet-style CNN and a small transformer,
and `captured_step`, one training step recorded by a debugger."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x):
        residual = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += residual
        return self.relu(out)


class ResNetCNN(nn.Module):
    """8 residual blocks, width 32, for 32x32 inputs."""

    def __init__(self, blocks: int = 8, width: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        self.layers = nn.Sequential(*[BasicBlock(width) for _ in range(blocks)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Transformer(nn.Module):
    """6 pre-norm blocks, d_model 128, 4 heads, GELU MLP."""

    def __init__(self, blocks: int = 6, d: int = 128, heads: int = 4, vocab: int = 1000):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = lambda: nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu",
                                                   batch_first=True, norm_first=True)
        self.blocks = nn.ModuleList([layer() for _ in range(blocks)])
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def cnn_workload(batch: int = 16):
    torch.manual_seed(0)
    model = ResNetCNN()
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    return model, (x, y), lambda m, b: F.cross_entropy(m(b[0]), b[1])


def transformer_workload(batch: int = 8, seq: int = 64):
    torch.manual_seed(0)
    model = Transformer()
    tokens = torch.randint(0, 1000, (batch, seq))
    return model, (tokens,), lambda m, b: F.cross_entropy(m(b[0]).flatten(0, 1), b[0].flatten())


def _hf_causal_lm(config):
    """A tiny Hugging Face causal LM built from a config (no download), with a batch of tokens."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    tokens = torch.randint(0, config.vocab_size, (2, 32))
    return model, (tokens,), lambda m, b: m(input_ids=b[0], labels=b[0]).loss


def llama_workload():
    """A 2-layer Llama (hidden 64, 4 heads) built from LlamaConfig: a plain step of ~10 ms."""
    from transformers import LlamaConfig
    return _hf_causal_lm(LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=4, max_position_embeddings=128))


def gpt2_workload():
    """A 2-layer GPT-2 (hidden 64, 4 heads) built from GPT2Config: a plain step of ~10 ms."""
    from transformers import GPT2Config
    return _hf_causal_lm(GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                    bos_token_id=0, eos_token_id=0))


def captured_step(dbg, model, batch, loss_fn, opt) -> None:
    """One training step (forward, backward, optimizer step) recorded by the debugger `dbg`."""
    dbg.start(model)
    opt.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    opt.step()
    dbg.stop()
    dbg.step()
