"""Dumps of tiny Hugging Face models (a Llama decoder, a BERT encoder, a T5 encoder-decoder;
built from configs, random weights, fp32, CPU, `task="tensor"`, level mix) computing the same
token sequences in other layouts: a sequence alone, the same sequence as a row of a right- or
left-padded batch (attention mask given), a prefill plus a decode step through the KV cache; made
once per test session by conftest.py's `token_dump`.

    golden = token_dump("alone")                    # SEQ alone: ids [1, 12]
    target = token_dump("left", fault="Functional.silu:1")   # layer 1's MLP activation 1% off
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import pytest
import torch

import opdiff
from opdiff.testing import inject_fault

_IDS = torch.Generator().manual_seed(1)
SEQ = torch.randint(1, 64, (12,), generator=_IDS)       # the sequence both sides compute
OTHER = torch.randint(1, 64, (9,), generator=_IDS)      # a shorter one that shares its batch


def llama() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()


def bert() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return transformers.BertModel(cfg).eval()


def t5() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg).eval()


MODELS = {"llama": llama, "bert": bert, "t5": t5}
DECODER_IDS = torch.tensor([[0, 5, 9, 3]])     # T5's decoder input, the same for every row


def batch(layout: str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """ids and attention mask of a layout (0 pads; the mask marks real tokens):
    alone: SEQ; short: OTHER alone; right: [SEQ; OTHER + 3 pads]; left: [3 pads + OTHER; SEQ];
    right_short: [OTHER + 3 pads; SEQ] (OTHER the padded row)."""
    if layout == "alone":
        return SEQ[None], None
    if layout == "short":
        return OTHER[None], None
    ids = torch.zeros(2, 12, dtype=torch.long)
    mask = torch.zeros(2, 12, dtype=torch.long)
    if layout == "right":
        ids[0], ids[1, :9] = SEQ, OTHER
        mask[0], mask[1, :9] = 1, 1
    elif layout == "left":
        ids[0, 3:], ids[1] = OTHER, SEQ
        mask[0, 3:], mask[1] = 1, 1
    elif layout == "right_short":
        ids[0, :9], ids[1] = OTHER, SEQ
        mask[0, :9], mask[1] = 1, 1
    else:
        raise ValueError(layout)
    return ids, mask


PROMPT, NEW = SEQ[:8], 4         # greedy `generate`: 8 prompt tokens, 4 new ones


def generated() -> torch.Tensor:
    """The prompt and the 4 tokens healthy greedy `generate` makes of it ([1, 12])."""
    with torch.no_grad():
        return llama().generate(PROMPT[None], max_new_tokens=NEW, do_sample=False,
                                pad_token_id=0)


def make_dump(path: Path, layout: str, fault: Optional[str] = None,
              task: str = "tensor", family: str = "llama") -> Path:
    """One forward of the layout's batch under `opdiff.dump` (layout "decode": a prefill of
    SEQ's first 11 tokens, then one decode step of its last through the KV cache; "generate":
    greedy `model.generate` of 4 tokens after PROMPT, a prefill and 3 decode steps; "generated":
    one forward of what healthy `generate` made, as a trainer scores a rollout); fault:
    "op:call", that call's output scaled by 1.01 (`inject_fault`)."""
    model = MODELS[family]()
    planted = nullcontext()
    if fault:
        op, call = fault.split(":")
        planted = inject_fault(op=op, call=int(call), scale=1.01)
    # (the inputs are made before recording: the dumps hold the model's ops only)
    ids, mask = batch("alone" if layout in ("decode", "generate", "generated") else layout)
    prefill, step = ids[:, :11].clone(), ids[:, 11:].clone()
    if layout == "generated":
        ids = generated()
    with planted, torch.no_grad():
        with opdiff.dump(model, str(path), level="mix", task=task):
            if layout == "generate":
                model.generate(PROMPT[None], max_new_tokens=NEW, do_sample=False, pad_token_id=0)
            elif layout == "decode":
                cache = model(input_ids=prefill, use_cache=True).past_key_values
                model(input_ids=step, past_key_values=cache, use_cache=True)
            elif family == "t5":
                model(input_ids=ids, attention_mask=mask,
                      decoder_input_ids=DECODER_IDS.repeat(ids.shape[0], 1))
            else:
                model(input_ids=ids, attention_mask=mask)
    if fault:
        assert planted.hits == 1     # type: ignore[attr-defined]
    return path
