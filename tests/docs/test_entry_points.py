"""`python -m opdiff` is the `opdiff` program, and `--version` says the version the package is."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import opdiff

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "opdiff", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_python_m_opdiff_is_the_cli():
    version = _run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"opdiff {opdiff.__version__}"
    bad = _run("compare", "--no-such-option")
    assert bad.returncode == 2 and bad.stderr.startswith("opdiff: error:")
    missing = _run("overflow", str(ROOT / "no-such-dump"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_version_is_the_package_version():
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared and declared.group(1) == opdiff.__version__
