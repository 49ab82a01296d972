"""What replaying regions as chains (`opdiff.comparison.replay.chain`) costs a compare.

    python benchmarks/bench_region_replay.py [--hidden 32] [--seq 8] [--layers 2] [--rounds 5]

A Hugging Face Llama built from its config (nothing downloaded), fp32 eager attention (golden)
against bf16-autocast SDPA (target), tensor dumps, one forward and backward at level mix: every
layer's attention is a region. Two targets: healthy (the walk replays every op and region, as a
compare that finds nothing must) and a 1% noise fault in layer 1's SDPA (found by the chain:
its own-dtype run goes too). Each round compares with region replay and without it (regions
left to the comparison alone, as before it existed), alternating, in one process, one replay
thread; reports the medians and spread of the compare's wall time and the seconds spent in
region chains.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

import opdiff
from opdiff.comparison import blame
from opdiff.comparison.replay import Replayer
from opdiff.testing import inject_fault

SDPA = "Functional.scaled_dot_product_attention"


def _model(impl: str, hidden: int, seq: int, layers: int) -> torch.nn.Module:
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max(32, seq), attn_implementation=impl)
    return transformers.LlamaForCausalLM(cfg).eval()


def _dump(path: Path, impl: str, bf16: bool, noise: float, args: argparse.Namespace) -> str:
    torch.manual_seed(0)
    model = _model(impl, args.hidden, args.seq, args.layers)
    ids = torch.randint(0, 64, (2, args.seq))
    planted = inject_fault(op=SDPA, call=1, scale=1.0, noise=noise) if noise else nullcontext()
    with planted:
        with opdiff.dump(model, str(path), level="mix", task="tensor"):
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
                loss = model(ids, labels=ids).loss
            loss.backward()
    return str(path)


def _compare(target: str, golden: str, out: Path, chains: bool) -> tuple[float, float, str]:
    spent = [0.0]
    judge_region = Replayer.judge_region
    members = blame.region_members

    def timed(self, name, names):
        found = judge_region(self, name, names)
        spent[0] += found.seconds
        return found

    Replayer.judge_region = timed                       # type: ignore[method-assign]
    if not chains:
        blame.region_members = lambda op: None          # type: ignore[assignment]
    try:
        start = time.perf_counter()
        result = opdiff.compare(target, golden, str(out), progress=False)
        wall = time.perf_counter() - start
    finally:
        Replayer.judge_region = judge_region            # type: ignore[method-assign]
        blame.region_members = members
    first = result.first_divergence
    return wall, spent[0], first.name if first is not None else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import os
    os.environ["OPDIFF_REPLAY_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        golden = _dump(root / "golden", "eager", False, 0.0, args)
        targets = {"healthy": _dump(root / "healthy", "sdpa", True, 0.0, args),
                   "noise 1%": _dump(root / "noise", "sdpa", True, 0.01, args)}
        _compare(targets["healthy"], golden, root / "warm", True)        # imports, caches
        print(f"Llama hidden {args.hidden}, seq {args.seq}, {args.layers} layers; "
              f"{args.rounds} rounds; torch {torch.__version__}; {os.cpu_count()} CPUs (shared)")
        print(f"{'target':10} {'region replay':14} {'compare s (median, min-max)':30} "
              f"{'in chains s':12} first divergence")
        for label, target in targets.items():
            runs: dict[bool, list[tuple[float, float, str]]] = {True: [], False: []}
            for i in range(args.rounds):
                for chains in (True, False) if i % 2 == 0 else (False, True):
                    runs[chains].append(_compare(target, golden, root / f"o{i}{chains}", chains))
            for chains in (True, False):
                walls = [r[0] for r in runs[chains]]
                spent = statistics.median(r[1] for r in runs[chains])
                print(f"{label:10} {'on' if chains else 'off':14} "
                      f"{statistics.median(walls):6.3f} ({min(walls):.3f}-{max(walls):.3f})"
                      f"{'':11} {spent:10.4f}   {runs[chains][0][2]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
