"""The Monitor takes an optimizer as training frameworks hand it out, wrapped: Hugging Face's
Trainer (Accelerate's AcceleratedOptimizer) and Lightning's LightningOptimizer pass for a
torch.optim.Optimizer without its hooks. The Monitor hooks the optimizer inside and records
update norms; nothing of ours raises into the training loop."""
import csv
import logging

import pytest
import torch

import opdiff
from opdiff.monitor.monitor import unwrap_optimizer


def _rows(directory):
    files = list(directory.rglob("metrics.csv"))
    assert len(files) == 1, files
    with open(files[0], newline="") as fh:
        return list(csv.DictReader(fh))


def _update_columns(rows):
    return [k for k in rows[0] if "update" in k]


def test_monitor_under_hf_trainer_with_its_wrapped_optimizer(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, num_labels=2)
    model = transformers.BertForSequenceClassification(cfg)
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)}
            for i in range(16)]
    seen = {}

    class MonitorCallback(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            seen["optimizer"] = type(optimizer).__name__
            self.mon = opdiff.Monitor(model, tmp_path / "mon", optimizer=optimizer)

        def on_step_end(self, args, state, control, **kwargs):
            self.mon.step()

        def on_train_end(self, args, state, control, **kwargs):
            self.mon.close()

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[MonitorCallback()])
    with caplog.at_level(logging.WARNING, logger="opdiff"):
        trainer.train()
    assert seen["optimizer"] == "AcceleratedOptimizer"
    assert not [r for r in caplog.records if "Monitor" in r.getMessage()], caplog.text
    rows = _rows(tmp_path / "mon")
    assert len(rows) == 3
    updates = _update_columns(rows)
    assert updates and all(float(r[c]) > 0 for r in rows for c in updates[:3])


def test_lightning_optimizer_is_unwrapped(tmp_path):
    pytest.importorskip("lightning")
    from lightning.pytorch.core.optimizer import LightningOptimizer
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = LightningOptimizer(inner)
    assert isinstance(wrapped, torch.optim.Optimizer)     # passes for one, without the hooks
    assert unwrap_optimizer(wrapped) is inner
    mon = opdiff.Monitor(model, tmp_path / "mon", optimizer=wrapped)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        inner.step()        # what Lightning's strategy runs inside wrapped.step()
        mon.step()
        inner.zero_grad()
    mon.close()
    rows = _rows(tmp_path / "mon")
    assert len(rows) == 2 and _update_columns(rows)
    assert all(float(r[_update_columns(rows)[0]]) > 0 for r in rows)


def test_unwrap_leaves_plain_optimizers_and_none_alone():
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert unwrap_optimizer(opt) is opt and unwrap_optimizer(None) is None
