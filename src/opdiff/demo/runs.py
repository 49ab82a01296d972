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


def run_in_process(scenario: str, side: str, dump: Path, *extra: str) -> list:
    """Run one side in a fresh Python process (the opdiff imported here is the one it imports);
    returns its losses. RuntimeError with the process's last words when it fails."""
    package_root = str(Path(opdiff.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-m", "opdiff.demo.runs", scenario, side, str(dump),
                           *extra], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise RuntimeError(f"the demo's {side} run ({scenario}) failed:\n{tail}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


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
