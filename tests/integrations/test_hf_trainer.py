"""Hugging Face Trainer with opdiff's callback: a tiny Llama built from a config, fine-tuned on
token data made here with gradient accumulation; the configured steps are dumped (both
micro-batches of a step in it) and a planted fault in its silu is named."""
from __future__ import annotations

import contextlib
import json

import pytest

import opdiff
from opdiff.testing.faults import inject_fault
from trainerkit import Tokens, tiny_llama, training_args

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def _train(root, fault: bool):
    from opdiff.integrations.transformers import OpdiffCallback

    model = tiny_llama()
    args = training_args(root, gradient_accumulation_steps=2, max_steps=3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                   callbacks=[OpdiffCallback(dump_path=str(root / "dump"), steps=[0, 1], level="mix")])
    with inject_fault("Functional.silu", call=0, scale=1.01) if fault else contextlib.nullcontext():
        trainer.train()
    return root / "dump"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    (tmp / "t").mkdir()
    (tmp / "g").mkdir()
    return _train(tmp / "t", fault=True), _train(tmp / "g", fault=False)


def test_the_configured_steps_are_dumped_with_every_micro_batch(dumps):
    target, golden = dumps
    assert sorted(p.name for p in golden.iterdir()) == ["step0", "step1"]
    records = [json.loads(line) for line in (golden / "step1/rank0/records.jsonl").open()]
    forward = [r["op"] for r in records if r.get("phase") == "forward"]
    assert forward.count("Functional.silu") == 2          # two micro-batches, one layer each
    assert any(op.startswith("Module.model.layers.0") for op in forward)


SCRIPT = """
import torch, transformers

class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (8, 8), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}

torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
args = transformers.TrainingArguments(output_dir="out", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                      max_steps=3, learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
                                      logging_strategy="no", dataloader_num_workers=0, seed=0, disable_tqdm=True)
transformers.Trainer(model=transformers.LlamaForCausalLM(config), args=args, train_dataset=Tokens()).train()
"""


@pytest.mark.slow
def test_opdiff_run_finds_the_trainers_steps(tmp_path):
    """The same Trainer with no callback, under `opdiff run`: the optimizer steps Accelerate
    wraps bound the steps, both micro-batches in each."""
    from runkit import run

    (tmp_path / "hf_train.py").write_text(SCRIPT)
    proc = run(["-m", "opdiff", "run", "--dump", "dump", "--steps", "0,1", "--", "python", "hf_train.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step0", "step1"]
    for step in (0, 1):
        records = [json.loads(line) for line in (tmp_path / f"dump/step{step}/rank0/records.jsonl").open()]
        assert [r["op"] for r in records if r.get("phase") == "forward"].count("Functional.silu") == 2


def test_a_planted_fault_is_named(dumps):
    target, golden = dumps
    fd = opdiff.compare(str(target), str(golden)).first_divergence
    assert fd is not None and (fd.step, fd.op, fd.origin) == (0, "Functional.silu", "op")
