"""Make tests/data/msprobe_llama/ (run once, by hand; the output is committed): real msprobe dumps
of a tiny Hugging Face Llama with eager attention and with SDPA.

msprobe lives in its own virtual environment so the system torch stays untouched:

    python -m venv --system-site-packages /tmp/msprobe-venv
    /tmp/msprobe-venv/bin/pip install mindstudio-probe          # 26.2.0 was used
    /tmp/msprobe-venv/bin/python tests/data/make_fixtures/make_msprobe_llama.py

The model, seed and input are those of tests/comparison/regionkit.py's `make_dump` (Llama from a
config: 2 layers, hidden 32, eval mode, `torch.manual_seed(0)` before the model is built, ids
from `torch.randint(0, 64, (2, 8))`, loss with `labels=ids`, one forward and backward), so an
opdiff dump made by that kit in a test pairs with these files weight for weight. msprobe's
PrecisionDebugger runs at level mix, task statistics, step 0.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "msprobe_llama"


def run_one(impl: str, dump_path: Path) -> None:
    """Child process: one step of the tiny Llama under msprobe."""
    import transformers
    from msprobe.pytorch import PrecisionDebugger, seed_all

    seed_all(1234)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attn_implementation=impl)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 8))
    config = {
        "task": "statistics", "dump_path": str(dump_path), "rank": [], "step": [0],
        "level": "mix", "extra_info": True, "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"]},
    }
    cfg_file = dump_path.parent / f"config_{impl}.json"
    cfg_file.write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(cfg_file))
    debugger.start(model)
    loss = model(ids, labels=ids).loss
    loss.backward()
    debugger.stop()
    debugger.step()
    print(f"{impl}: loss={loss.item():.9f}")


def main() -> None:
    if len(sys.argv) == 3:
        run_one(sys.argv[1], Path(sys.argv[2]))
        return
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="msprobe_llama_"))
    for impl in ("eager", "sdpa"):
        dump = work / impl
        dump.mkdir(parents=True)
        subprocess.run([sys.executable, __file__, impl, str(dump)], check=True)
        for proc in glob.glob(str(dump / "step*" / "proc*")):
            os.rename(proc, Path(proc).parent / "rank0")
        shutil.copytree(dump, OUT / impl, ignore=shutil.ignore_patterns("config_*.json"))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
