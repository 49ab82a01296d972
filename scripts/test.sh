#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then lint, type-check, build the
# docs site and run the whole suite. Used as-is by the README and by CI (.ci/run, which also sets
# OPDIFF_REQUIRE_BROWSER=1 so that a missing browser fails instead of skipping).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install -q torch==2.13.0            # the pinned CPU build first: a bare 'torch' pulls CUDA
python -m pip install -q -e ".[test]"

# The HTML report is tested in a real browser (Debian's chromium, headless).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium not found and cannot install it (needs root + apt): browser tests will be skipped" >&2
  fi
fi

python -m ruff check src tests benchmarks docs
python -m mypy
# The docs site: a broken link, a missing API reference or a page generated from a parser that
# changed fails here (docs/hooks.py writes the reference pages from the code).
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
# The suite in two parts (tests/conftest.py): on one worker per core, at most four, each running
# one top-level test directory at a time; then the tests that start Ray clusters and torchrun
# process groups, alone. Exit status 5 (a part with no test selected) is no failure.
workers=$(python -c "import os; print(max(1, min(4, os.cpu_count() or 1)))")
status=0
OPDIFF_TEST_PART=parallel python -m pytest -q -n "$workers" --dist loadgroup "$@" || status=$?
[ "$status" = 5 ] && status=0
alone=0
OPDIFF_TEST_PART=alone python -m pytest -q "$@" || alone=$?
[ "$alone" = 5 ] && alone=0
[ "$status" = 0 ] && status=$alone
# Another CPU's kernels: the records' fingerprint again with oneDNN and ATen's vectorisation held
# to the oldest instruction set (another vendor's CPU picks other convolution and matmul kernels;
# nothing the suite compares with a committed number may depend on that choice).
other=0
ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default OPDIFF_TEST_PART=parallel python -m pytest -q \
  tests/capture/test_records_unchanged.py -k "cnn-mix or transformer-mix" || other=$?
[ "$status" = 0 ] && status=$other
# torchao's float8 training emulation (tests/lowp/test_torchao.py), from a folder of its own: once
# torchao is installed, transformers imports it in every model it builds, across the suite.
torchao=0
tao=$(mktemp -d)
if python -m pip install -q --no-deps --target "$tao" "torchao>=0.18"; then
  PYTHONPATH="$tao${PYTHONPATH:+:$PYTHONPATH}" OPDIFF_REQUIRE_TORCHAO=1 OPDIFF_TEST_PART=parallel \
    python -m pytest -q tests/lowp/test_torchao.py || torchao=$?
else
  torchao=1
fi
[ "$status" = 0 ] && status=$torchao
exit "$status"
