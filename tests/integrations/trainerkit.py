"""What the Hugging Face Trainer tests share: token data made here, a tiny Llama built from a
config (no download), and the TrainingArguments of a quiet CPU run."""
from __future__ import annotations

import torch


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 8, length: int = 8, vocab: int = 64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(config)


def training_args(root, **options):
    """TrainingArguments for a CPU run writing under `root`, nothing reported or saved."""
    import transformers

    return transformers.TrainingArguments(output_dir=str(root / "out"), per_device_train_batch_size=2,
                                          learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
                                          logging_strategy="no", dataloader_num_workers=0, seed=0,
                                          disable_tqdm=True, **options)
