"""`opdiff run -- CMD`: capture (or monitor) a training run without editing it.

    opdiff run --dump ./dump/npu --steps 0-1 -- python train.py --lr 3e-4
    torchrun --nproc_per_node 8 -m opdiff run --config dump.json -- train.py ...

How it reaches every process of the launch (the way coverage.py measures subprocesses):

- `runner.py` (the command) writes the settings into the environment variable
  `OPDIFF_RUN_CONFIG` (JSON) and puts `launch/site/` first on `PYTHONPATH`; every Python
  process started below it (torchrun / accelerate / deepspeed workers, multiprocessing spawn)
  imports that directory's `sitecustomize.py` at start-up, which imports `bootstrap.py`.
  A `python script.py` or bare `script.py` command runs in this very process (runpy), so its
  exit code, arguments, stdin/stdout and signals are its own; other commands replace this
  process (`os.execvpe`), so the same holds.
- `bootstrap.py` does nothing until torch is imported (a post-import hook), then installs
  `autorun.py`'s global hooks: it finds the model, the step boundaries and the configured
  steps and ranks, and starts and stops a `PrecisionDebugger` (or an `opdiff.Monitor`).
"""
from __future__ import annotations

ENV = "OPDIFF_RUN_CONFIG"

__all__ = ["ENV"]
