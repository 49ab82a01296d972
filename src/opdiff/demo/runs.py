"""One recorded training run of an origin scenario, in its own process, as a user's two scripts
(golden and target) would each run in theirs:

    python -m opdiff.demo.runs wrong-weights golden DUMP CHECKPOINT
    python -m opdiff.demo.runs dropout target DUMP

prints its losses as one JSON line. `wrong-weights` builds the 3D-ResNet, loads CHECKPOINT into
it and trains; `dropout` builds the classifier with dropout and, on the target side, seeds the
generator again after building it (as a data-loading helper might): the same weights and data,
other dropout masks.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import torch

import opdiff

from . import models

SEED = 1234
RESEED = 4321           # the target's second torch.manual_seed in the dropout story


def wrong_weights(side: str, dump: str, checkpoint: str) -> list:
    from .scenarios import seeded_resnet, train

    model, batch = seeded_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    return train(model, batch, dump)


def dropout(side: str, dump: str) -> list:
    from .scenarios import train

    opdiff.seed_all(SEED)
    model = models.DropoutClassifier()
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    if side == "target":
        torch.manual_seed(RESEED)
    return train(model, batch, dump)


def run_sides(scenario: str, sides: dict) -> dict:
    """Run each side in a fresh Python process, the two at once (the opdiff imported here is
    the one they import); `sides` maps a side to (dump, extra arguments). Returns each side's
    losses. RuntimeError with a process's last words when one fails."""
    package_root = str(Path(opdiff.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    procs = {side: subprocess.Popen([sys.executable, "-m", "opdiff.demo.runs", scenario, side,
                                     str(dump), *extra], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
             for side, (dump, extra) in sides.items()}
    losses = {}
    try:
        for side, proc in procs.items():
            out, err = proc.communicate(timeout=600)
            if proc.returncode != 0:
                tail = "\n".join(err.strip().splitlines()[-8:])
                raise RuntimeError(f"the demo's {side} run ({scenario}) failed:\n{tail}")
            losses[side] = list(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return losses


def main(argv: Optional[list] = None) -> int:
    scenario, side, dump, *extra = argv if argv is not None else sys.argv[1:]
    torch.set_num_threads(1)        # tiny tensors (see demo._demo_process_state)
    if scenario == "wrong-weights":
        losses = wrong_weights(side, dump, *extra)
    else:
        losses = dropout(side, dump)
    print(json.dumps(losses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
