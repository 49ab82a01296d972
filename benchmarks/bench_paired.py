"""Capture time of this opdiff against another version, alternating in one process.

    git archive <commit> src | tar -x -C /tmp/old
    python benchmarks/bench_paired.py --against /tmp/old/src [--models mlp,llama] [--level mix]
                                      [--rounds 21] [--pattern reuse] [--control]

Ratios between separate benchmark runs cannot resolve a 5-10% change on a shared machine: the
machine's speed moves more than that between runs. Here the other version is loaded beside this
one (a copy of its package renamed `opdiff_other`), and each round records one training step with
each, in alternating order, on the CPU clock (one thread). Printed: the median of the per-round
ratios this / other, with the middle half of them. `--control` pairs this opdiff with a renamed
copy of itself: its ratios show what the harness reads when nothing changed (0.95-1.05 here on
the tiny Llama, whose steps are the noisiest).

Models: mlp (bench_per_op's deep MLP of tiny layers), cnn, transformer, llama, gpt2 (models.py).
`--pattern construct` makes a new debugger for every step (as `opdiff.dump()` per step does)
instead of starting and stopping one.
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402
from bench_per_op import tiny_mlp  # noqa: E402

import opdiff  # noqa: E402

THIS_SRC = Path(opdiff.__file__).resolve().parent.parent
_ABSOLUTE = re.compile(r"\b(from|import) opdiff\b|import_module\(f\"opdiff\.")


def renamed_copy(src: Path, into: Path, name: str = "opdiff_other") -> None:
    """Copy the opdiff package under `src` to `into/name`, its absolute imports renamed."""
    target = into / name
    shutil.copytree(src / "opdiff", target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.rglob("*.py"):
        text = path.read_text()
        renamed = _ABSOLUTE.sub(lambda m: m.group(0).replace("opdiff", name), text)
        if renamed != text:
            path.write_text(renamed)


def workload(name: str):
    """(model, one training step) of a model of this benchmark."""
    torch.manual_seed(0)
    if name == "mlp":
        model, x = tiny_mlp(), torch.randn(4, 16)

        def loss(m, _):
            return m(x).square().mean()
        batch = None
    else:
        model, batch, loss = getattr(models, f"{name}_workload")()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        loss(model, batch).backward()
        opt.step()
    return model, step


def paired(name: str, packages: dict, level: str, rounds: int, pattern: str) -> list:
    """Per-round ratios of the captured step's CPU time, first package / second."""
    model, step = workload(name)
    for _ in range(2):
        step()
    first, second = packages
    times: dict = {k: [] for k in packages}
    with tempfile.TemporaryDirectory(prefix="opdiff-bench-") as root:
        shared = {k: m.PrecisionDebugger(dump_path=f"{root}/{k}", level=level, task="statistics")
                  for k, m in packages.items()}
        for r in range(rounds + 2):            # two warm-up rounds, not counted
            for k in (first, second) if r % 2 else (second, first):
                dbg = shared[k] if pattern == "reuse" else packages[k].PrecisionDebugger(
                    dump_path=f"{root}/{k}-{r}", level=level, task="statistics")
                t0 = time.process_time()
                dbg.start(model)
                step()
                dbg.stop()
                dbg.step()
                times[k].append(time.process_time() - t0)
            if r % 10 == 9:     # keep the dumps small
                for k in packages:
                    shutil.rmtree(f"{root}/{k}", ignore_errors=True)
    return [a / b for a, b in zip(times[first][2:], times[second][2:])]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="src directory of the other opdiff")
    parser.add_argument("--control", action="store_true", help="pair this opdiff with a copy of itself")
    parser.add_argument("--models", default="mlp,llama", help="of mlp, cnn, transformer, llama, gpt2")
    parser.add_argument("--level", default="mix")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--pattern", choices=["reuse", "construct"], default="reuse")
    args = parser.parse_args(argv)
    src = THIS_SRC if args.control else args.against
    if src is None or not (src / "opdiff" / "__init__.py").exists():
        raise SystemExit("give --against SRC (the src directory of another checkout) or --control")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="opdiff-other-") as where:
        renamed_copy(src.resolve(), Path(where))
        sys.path.insert(0, where)
        import opdiff_other  # type: ignore[import-not-found]
        packages = {"this": opdiff, "other": opdiff_other}
        label = "a copy of this opdiff (control)" if args.control else str(src)
        print(f"this / {label}: captured-step CPU time, level {args.level}, {args.pattern}, "
              f"{args.rounds} paired rounds")
        for name in args.models.split(","):
            ratios = sorted(paired(name, packages, args.level, args.rounds, args.pattern))
            q = len(ratios) // 4
            print(f"{name:<12} {statistics.median(ratios):.3f}  (middle half {ratios[q]:.3f}-"
                  f"{ratios[-q - 1]:.3f})")


if __name__ == "__main__":
    main()
