"""Small real dumps and a real CLI for the output-directory and CSV/terminal security tests.

`write_dump` writes a statistics dump through opdiff's own DumpWriter, with the op names a test
chooses (a hostile dump names its ops whatever it likes); `cli` runs `opdiff` in a fresh Python
process, as a user's shell would.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from opdiff.store import DumpWriter

RUN_CLI = "import sys; from opdiff.cli import main; sys.exit(main(sys.argv[1:]))"


def _tensor(v: float) -> dict:
    return {"type": "tensor", "dtype": "float32", "shape": [4], "device": "cpu",
            "requires_grad": False,
            "stats": {"max": v, "min": -v, "mean": v / 10, "norm": 2 * v, "nan": 0, "inf": 0}}


def write_dump(path, ops, *, wrong: int | tuple = (), overflow: int | None = None, step: int = 0,
               frame=("/work/model.py", 3, "forward", "y = f(x)"),
               environment: dict | None = None) -> Path:
    """One step/rank of a statistics dump: op i reads a tensor of max i+1 and returns it, except
    op(s) `wrong`, whose output is three times too large (a local error there), and op `overflow`,
    whose output holds an inf; `environment` is its recorded fingerprint. Returns the dump root."""
    root = Path(path)
    w = DumpWriter(root / f"step{step}" / "rank0", {"config": {"task": "statistics"},
                                                    "environment": environment or {}})
    stack = w.stack_id((tuple(frame),))
    wrong = (wrong,) if isinstance(wrong, int) else wrong
    for seq, op in enumerate(ops):
        v = 1.0 + seq
        out = _tensor(v * 3 if seq in wrong else v)
        if seq == overflow:
            out["stats"].update(max="Infinity", norm="Infinity", mean="Infinity", inf=1)
        w.write({"seq": seq, "name": f"{op}.0.forward", "op": op, "kind": "api",
                 "phase": "forward", "module": None, "inputs": [_tensor(v)], "outputs": [out],
                 "stack": stack})
    w.close()
    return root


def cli(*args, timeout: float = 300, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """`opdiff ARGS` in a new process (this checkout's opdiff), its output captured as text."""
    return subprocess.run([sys.executable, "-c", RUN_CLI, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**env(), **(extra_env or {})})


def start_cli(*args, **popen) -> subprocess.Popen:
    """`opdiff ARGS` started in a new process, not waited for."""
    return subprocess.Popen([sys.executable, "-c", RUN_CLI, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            **popen)


def env() -> dict:
    """The environment for a child: this checkout's opdiff first on the path."""
    import opdiff

    src = str(Path(opdiff.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
