"""opdiff's compare against msprobe's on the same training step: the benchmark CNN, bf16 autocast
against fp32, both tools dumping every op's tensors, on the CPU.

    python benchmarks/bench_msprobe_compare.py [--msprobe-python PY] [--runs 3] [--dir DIR]

msprobe (PyPI `mindstudio-probe`) needs packages opdiff does not, so it usually lives in its own
venv: `python -m venv --system-site-packages /tmp/msvenv && /tmp/msvenv/bin/pip install
--no-deps mindstudio-probe` plus the pure-Python packages its import asks for (einops, openpyxl,
psutil, pytz, wheel; and matplotlib, which its compare imports). `--msprobe-python` (default:
$OPDIFF_MSPROBE_PYTHON, else this interpreter) names that venv's interpreter. When it cannot
import msprobe this prints why and exits 0 (skipped).

Dumps: one forward+backward of benchmarks/models.py's ResNet-style CNN (batch 24), the golden
in fp32 and the target under CPU bf16 autocast. msprobe: `PrecisionDebugger` with task "tensor",
level "L1" (every API's inputs and outputs, forward and backward). opdiff: `opdiff.dump(level=
"mix", task="tensor")`, as benchmarks/bench_compare.py's cnn-bf16 pair.

Timed: each tool's own command line, `msprobe compare --target_path T --golden_path G
--output_path O` and `opdiff compare T G -o O` (default settings, replay included), each a whole
process (interpreter start and imports included, both pay torch's), run for run alternating so
both see the same machine load. Reported: wall time and CPU time (user+sys of the process and
its children: msprobe compares in a process pool) with median and (min-max), the MB of saved
tensors per side, and the ratio msprobe / opdiff on both clocks. On a shared machine the CPU
ratio is the steadier one.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

# Runs in the msprobe interpreter: one step of the CNN dumped by msprobe's PrecisionDebugger.
_MSPROBE_DUMP = r"""
import json, os, sys
sys.path.insert(0, sys.argv[3])
import torch
import models
from msprobe.pytorch import PrecisionDebugger
side, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
config = {"task": "tensor", "dump_path": out, "rank": [], "step": [], "level": "L1",
          "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f)
model, batch, loss_fn = models.cnn_workload(batch=24)
debugger = PrecisionDebugger(config_path=os.path.join(out, "config.json"))
debugger.start(model)
with torch.autocast("cpu", dtype=torch.bfloat16, enabled=side == "bf16"):
    loss = loss_fn(model, batch)
loss.float().backward()
debugger.stop()
debugger.step()
"""


_OPDIFF_CLI = "import sys; from opdiff.cli import main; sys.exit(main())"


def msprobe_missing(python: str) -> str:
    """Why `python` cannot run msprobe ("" when it can)."""
    try:
        proc = subprocess.run([python, "-c", "import msprobe.pytorch, msprobe.msprobe"],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}"
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        return f"{python} cannot import msprobe: {lines[-1] if lines else 'no message'}"
    return ""


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children) of one command; exits on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def tensor_mb(root: Path, suffixes: tuple[str, ...]) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.suffix in suffixes) / 1e6


def build(root: Path, msprobe_python: str) -> dict[str, Path]:
    """Both tools' dumps of the same step, built once (kept in --dir)."""
    sys.path.insert(0, str(HERE))
    import bench_compare

    dirs = {"msprobe": root / "msprobe", "opdiff": root / "opdiff"}
    for side in ("fp32", "bf16"):
        out = dirs["msprobe"] / side
        if not (out / "step0").exists():
            subprocess.run([msprobe_python, "-c", _MSPROBE_DUMP, side, str(out), str(HERE)],
                           check=True, capture_output=True)
    if not (dirs["opdiff"] / "golden").exists():
        bench_compare.build_model(dirs["opdiff"], "cnn", "tensor", bf16=True)
    return dirs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--msprobe-python", default=os.environ.get("OPDIFF_MSPROBE_PYTHON",
                                                                sys.executable),
                    help="an interpreter that imports msprobe (default: $OPDIFF_MSPROBE_PYTHON, "
                         "else this one)")
    ap.add_argument("--runs", type=int, default=3, help="compares per tool (median)")
    ap.add_argument("--dir", default=None, help="where to build the dumps or find them (kept)")
    args = ap.parse_args(argv)
    why = msprobe_missing(args.msprobe_python)
    if why:
        print(f"skipped: {why}. Install msprobe in a venv of its own (see this script's "
              f"docstring) and pass --msprobe-python.")
        return 0
    root = Path(args.dir or tempfile.mkdtemp(prefix="opdiff-msprobe-"))
    try:
        dirs = build(root, args.msprobe_python)
        ms_t, ms_g = (next((dirs["msprobe"] / s / "step0").glob("proc*")).parent
                      for s in ("bf16", "fp32"))
        env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        tools = {
            "msprobe": lambda out: [args.msprobe_python, "-m", "msprobe.msprobe", "compare",
                                    "--target_path", str(ms_t), "--golden_path", str(ms_g),
                                    "--output_path", str(out)],
            "opdiff": lambda out: [sys.executable, "-c", _OPDIFF_CLI, "compare",
                                   str(dirs["opdiff"] / "target"), str(dirs["opdiff"] / "golden"),
                                   "-o", str(out), "--no-progress"],
        }
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} cores")
        times: dict[str, list[tuple[float, float]]] = {t: [] for t in tools}
        for i in range(args.runs):
            for tool, cmd in tools.items():
                out = root / f"out-{tool}-{i}"
                shutil.rmtree(out, ignore_errors=True)
                times[tool].append(timed(cmd(out), env if tool == "opdiff" else None))
        print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        sizes = {"msprobe": tensor_mb(dirs["msprobe"] / "fp32", (".pt", ".npy")),
                 "opdiff": tensor_mb(dirs["opdiff"] / "golden", (".safetensors",))}
        print(f"\n{'tool':<9}{'MB/side':>8}{'wall s':>8}{'(min-max)':>14}{'CPU s':>8}"
              f"{'(min-max)':>14}")
        med = {}
        for tool, runs in times.items():
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            med[tool] = (statistics.median(walls), statistics.median(cpus))
            print(f"{tool:<9}{sizes[tool]:8.0f}{med[tool][0]:8.2f}"
                  f"{f'({min(walls):.2f}-{max(walls):.2f})':>14}{med[tool][1]:8.2f}"
                  f"{f'({min(cpus):.2f}-{max(cpus):.2f})':>14}")
        ratio = {k: med["msprobe"][i] / med["opdiff"][i] for i, k in enumerate(("wall", "cpu"))}
        print(f"\nmsprobe / opdiff: {ratio['wall']:.1f}x wall, {ratio['cpu']:.1f}x CPU "
              f"(goal: >= 10x); {args.runs} runs, whole processes, machine possibly shared")
        print(json.dumps({"runs": times, "mb_per_side": sizes, "ratio": ratio}))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
