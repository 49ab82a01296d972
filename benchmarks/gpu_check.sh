#!/usr/bin/env bash
# The GPU check: one prepared run, under 10 minutes, for a session that is lent a CUDA machine.
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine, from the repository root
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh --quick   # the same steps on CPU (plumbing)
#   bash benchmarks/gpu_check.sh --fetch-wheels  # here, before: wheels the bare GPU machine lacks
#   (GPU_CHECK_COMMIT=SHA names the commit in the table where the copy has no .git)
#
# Steps, each under `timeout`: set up (opdiff from src/, missing packages from .whl/ or pip),
# print the device, run `pytest -m cuda tests/cuda` (torch.compile's and FP8's tests in steps of
# their own: FP8 is torch._scaled_mm, skipped below compute capability 8.9),
# then the capture ratio benchmarks on the
# device (bench_per_op.py: host time per record; bench_capture.py: step time with opdiff / plain
# step, for cnn, transformer and, if transformers is installed, tiny llama and gpt2; and
# `--floor`: a bare torch-function mode and the floor recorder on the same models). The demo
# is not run on the device: `opdiff demo` has no device option (it trains on CPU), so the table
# says so instead of a verdict. Prints one table at the end, also written to $OUT/gpu_check.txt
# (and the whole log to $OUT/gpu_check.log) when $OUT is set. Exit 1 when a step failed.
set -u
cd "$(dirname "$0")/.." || exit 2
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
QUICK=0
for arg in "$@"; do
    case $arg in
        --quick) QUICK=1 ;;
        --fetch-wheels)
            # The GPU machine reaches no index; orjson is the one runtime dependency its image
            # lacks (docs/performance/index.md). Fetched here into .whl/ (in .gitignore): name it in
            # the device run's `carry`.
            exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
                --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
                -d .whl orjson ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LOG=${OUT:+$OUT/gpu_check.log}
LOG=${LOG:-$WORK/log}
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
STATUS=$WORK/status          # one line per step: name rc seconds
exec 3>&1 4>&2 > >(tee "$LOG") 2>&1
TEE=$!
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

step() {      # step NAME SECONDS COMMAND...: run under timeout, record rc and time
    local name=$1 limit=$2 start rc
    shift 2
    echo "== $name (limit ${limit}s): $*"
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    echo "$name $rc $(( $(date +%s) - start ))" >>"$STATUS"
    [ "$rc" = 124 ] && echo "== $name: stopped at its ${limit}s limit"
    return 0
}

setup() {
    "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q torch || return 1
    missing=$("$PY" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("numpy", "safetensors", "rich", "orjson", "pytest")
               if importlib.util.find_spec(m) is None))
EOF
)
    if [ -n "$missing" ]; then
        echo "missing: $missing"
        if ls .whl/*.whl >/dev/null 2>&1; then     # carried wheels (no index on the GPU machine)
            "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl || return 1
        else                     # none of these depends on torch: torch is never reinstalled
            "$PY" -m pip install -q $missing || return 1
        fi
    fi
    "$PY" -c "import opdiff, torch; print('opdiff from', opdiff.__file__, '| torch', torch.__version__)"
}
export -f setup
export PY WORK
[ -d "$WORK/site" ] || mkdir -p "$WORK/site"
export PYTHONPATH="$PYTHONPATH:$WORK/site"

step setup 45 bash -c setup
step device 20 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    || echo 'no nvidia-smi'; \"$PY\" -c \"import torch; print('torch', torch.__version__, '| cuda available:', \
    torch.cuda.is_available(), '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')\""
step tests 150 "$PY" -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider --junitxml="$WORK/junit.xml" \
    --ignore=tests/cuda/test_cuda_compile.py --ignore=tests/cuda/test_cuda_fp8.py
# FP8: torch._scaled_mm recorded, its casts judged by their format (skipped below sm 8.9)
step fp8 60 "$PY" -m pytest -m cuda tests/cuda/test_cuda_fp8.py -q -rs -p no:cacheprovider
# torch.compile on CUDA (Triton) in a step of its own: its compiles may take long, and a
# timeout here loses this test's answer, not the others'
step compile 100 "$PY" -m pytest -m cuda tests/cuda/test_cuda_compile.py -q -rs -p no:cacheprovider
if [ "$QUICK" = 1 ]; then
    PER_OP_STEPS=3; STEPS=2; SETTINGS=mix:statistics; MODELS=cnn,llama
else
    PER_OP_STEPS=15; STEPS=7; SETTINGS=mix:statistics,L1:tensor; MODELS=cnn,transformer,llama,gpt2
fi
"$PY" -c "import transformers" 2>/dev/null || { MODELS=cnn,transformer; echo "transformers missing: no llama/gpt2"; }
step per_op 45 "$PY" benchmarks/bench_per_op.py --floor --device "$DEVICE" --steps "$PER_OP_STEPS" --json "$WORK/per_op.json"
step capture 130 "$PY" benchmarks/bench_capture.py --device "$DEVICE" --steps "$STEPS" --models "$MODELS" \
    --settings "$SETTINGS" --json "$WORK/capture.json"
# the floor under any Python capture on the same models (issue 29 states its targets against it)
step floor 50 "$PY" benchmarks/bench_capture.py --floor --device "$DEVICE" --steps "$STEPS" --models "$MODELS" \
    --json "$WORK/floor.json"

COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo "unknown (no git here; set GPU_CHECK_COMMIT)")}
"$PY" - "$WORK" "$DEVICE" "$COMMIT" >"$WORK/table" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
work, device = Path(sys.argv[1]), sys.argv[2]
status = {}
for line in (work / "status").read_text().splitlines():
    name, rc, secs = line.split()
    status[name] = f"rc {rc}" + (" (timed out)" if rc in ("124", "137") else "") + f", {secs} s"
import torch
name = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else "-"
rows = [("device asked", device), ("device", f"{name} (torch {torch.__version__})"),
        ("commit", sys.argv[3])]
for name in ("setup", "device", "tests", "fp8", "per_op", "capture", "floor"):
    rows.append((f"step {name}", status.get(name, "not run")))
try:
    suite = ET.parse(work / "junit.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    rows.append(("pytest -m cuda tests/cuda", f"{n - f - e - s} passed, {f} failed, {e} errors, {s} skipped"))
except (OSError, ET.ParseError, IndexError):
    rows.append(("pytest -m cuda tests/cuda", "no result (see the log)"))
rows.append(("opdiff demo on the device", "not run: opdiff demo has no device option (CPU only)"))
try:
    p = json.loads((work / "per_op.json").read_text())
    rows.append((f"per record, MLP {p['level']} {p['task']}",
                 f"{p['us_per_record']:.1f} us (quartiles {p['q1']:.1f}-{p['q3']:.1f}), step x{p['ratio']:.2f}, "
                 f"{p['records']} records"))
    if p.get("floor_us_per_record") is not None:
        rows.append(("per record, floor recorder", f"{p['floor_us_per_record']:.1f} us"))
except (OSError, ValueError, KeyError):
    rows.append(("per record (bench_per_op)", "no result (see the log)"))
for what, file in (("capture ratios (bench_capture)", "capture.json"), ("floor (bench_capture --floor)", "floor.json")):
    try:
        for r in json.loads((work / file).read_text())["rows"]:
            rows.append((f"{r['model']} {r['level']} {r['task']}",
                         f"x{r['ratio']:.2f} plain (quartiles {r['q1']:.2f}-{r['q3']:.2f}), plain {r['plain_ms']:.1f} ms"))
    except (OSError, ValueError, KeyError):
        rows.append((what, "no result (see the log)"))
width = max(len(k) for k, _ in rows)
print("opdiff GPU check")
for k, v in rows:
    print(f"  {k:<{width}}  {v}")
EOF
echo
cat "$WORK/table"
if [ -n "${OUT:-}" ]; then
    cp "$WORK/table" "$OUT/gpu_check.txt"
fi
exec 1>&3 2>&4 3>&- 4>&-     # let tee finish the log before the script ends
wait "$TEE" 2>/dev/null || true
awk '$2 != 0 { bad = 1 } END { exit bad }' "$STATUS"     # exit 1 when a step failed or timed out
