"""torchao's float8 training (emulate=True: runs on CPU) captured by opdiff: its Float8TrainingTensor
inputs are described by the value they stand for (no record loses its statistics, as every one
of a flush did when the subclass was reduced as it is), its casts are found as quantize ops and
judged within e4m3, and the compare against bf16 names nothing. Skipped without torchao
(`pip install opdiff[fp8]`), which is not in the test extra: once installed, transformers
imports it, with its warnings, in every model it builds. scripts/test.sh runs this file from a
folder of its own with OPDIFF_REQUIRE_TORCHAO=1 (then it must run)."""
from __future__ import annotations

import json
import logging
import os

import pytest
import torch

import opdiff
from opdiff.comparison.result import Note, note_kind
from opdiff.lowp import judge_run
from opdiff.store.adapters import discover

from fp8kit import llama


def _step(path, fp8: bool):
    model = llama(False)
    if fp8:
        if os.environ.get("OPDIFF_REQUIRE_TORCHAO"):     # scripts/test.sh: it must run
            import torchao.float8 as float8
        else:
            float8 = pytest.importorskip("torchao.float8")
        float8.convert_to_float8_training(
            model, config=float8.Float8LinearConfig(emulate=True),
            module_filter_fn=lambda mod, name: name != "lm_head")
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with opdiff.dump(model, str(path), level="mix", task="tensor"):
        model(input_ids=ids, labels=ids).loss.backward()
    return path


@pytest.mark.slow
def test_torchao_float8_captured_and_judged(tmp_path, fp8_dump, caplog):
    pytest.importorskip("torchao.float8")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    with caplog.at_level(logging.WARNING, logger="opdiff"):
        target = _step(tmp_path / "ao", fp8=True)
    assert not [r for r in caplog.records if "capture failed" in r.getMessage()]
    records = [json.loads(line) for line in
               (target / "step0" / "rank0" / "records.jsonl").read_text().splitlines()]
    assert not [r["name"] for r in records if r.get("error")]
    mm = next(r for r in records if r["op"] == "Torch.mm")
    assert mm["inputs"][0]["dtype"] == "bfloat16" and mm["inputs"][0]["stats"]["norm"] > 0
    verdicts = judge_run(discover(target)[0])
    assert len(verdicts) == 28 and all(v.within for v in verdicts)
    assert {v.format for v in verdicts} == {"float8_e4m3fn"}

    result = opdiff.compare(target, fp8_dump("bf16"), output_path=tmp_path / "out", progress=False)
    assert result.first_divergence is None
    assert not [n for n in result.notes if note_kind(n) == Note.INCONCLUSIVE]
