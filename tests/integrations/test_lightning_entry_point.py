"""Lightning with no code change: opdiff's `lightning.pytorch.callbacks_factory` entry point
(read from package metadata, as installed by `pip install opdiff[lightning]`) gives every
Trainer the callback when OPDIFF_LIGHTNING names a dump directory; gradient accumulation keeps
both micro-batches in the step, and without the variable nothing is recorded."""
from __future__ import annotations

import json
import textwrap

import pytest
from runkit import SRC, run

pytest.importorskip("lightning")

SCRIPT = textwrap.dedent('''
    import torch, lightning

    class Net(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = lightning.Trainer(max_steps=3, accumulate_grad_batches=2, accelerator="cpu", logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=2))
''')


def _metadata(where):
    """An installed distribution's metadata declaring opdiff's entry point (what pip writes)."""
    info = where / "opdiff_entry_point_test-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: opdiff-entry-point-test\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[lightning.pytorch.callbacks_factory]\nopdiff = opdiff.integrations.lightning:callbacks_from_env\n")


@pytest.mark.slow
def test_the_entry_point_records_the_steps_without_code_changes(tmp_path):
    _metadata(tmp_path / "meta")
    (tmp_path / "fit.py").write_text(SCRIPT)
    path = f"{SRC}:{tmp_path / 'meta'}"
    proc = run(["fit.py"], tmp_path, PYTHONPATH=path, OPDIFF_LIGHTNING=str(tmp_path / "dump"),
               OPDIFF_LIGHTNING_STEPS="0,1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step0", "step1"]
    records = [json.loads(line) for line in (tmp_path / "dump/step1/rank0/records.jsonl").open()]
    forward = [r["op"] for r in records if r.get("phase") == "forward"]
    assert forward.count("Torch.tanh") == 2 and any(op.startswith("Module.net.0") for op in forward)
    proc = run(["fit.py"], tmp_path, PYTHONPATH=path)       # switched off: nothing recorded
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step0", "step1"]
