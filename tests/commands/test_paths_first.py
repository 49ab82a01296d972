"""A command's paths are checked before the work (issue 46, items 8 and 11): `compare` and
`check` say a dump does not exist, and `-o` naming a file, before torch is imported (seconds)
and before a long compare, on a real dump; `opdiff.compare(output_path=FILE)` refuses it before
it reads a dump."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import opdiff
from opdiff.errors import ConfigError

PROBE = textwrap.dedent("""
    import sys
    from opdiff.cli import main
    rc = main(sys.argv[1:])
    print("torch imported" if "torch" in sys.modules else "torch not imported", rc)
""")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    dbg = opdiff.PrecisionDebugger(dump_path=str(root / "dump"), task="statistics", level="L1")
    dbg.start(model)
    model(torch.randn(4, 8)).sum().backward()
    dbg.stop()
    dbg.step()
    return root / "dump"


def _cli(*argv):
    p = subprocess.run([sys.executable, "-c", PROBE, *map(str, argv)], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ))
    return p.stdout.strip().splitlines()[-1], p.stderr.strip()


@pytest.mark.parametrize("argv", [("compare", "{missing}", "{dump}"),
                                  ("compare", "{dump}", "{missing}"),
                                  ("check", "{missing}")])
def test_a_missing_dump_is_said_before_torch_is_imported(dump, tmp_path, argv):
    missing = tmp_path / "no_such_dump"
    said, err = _cli(*(a.format(missing=missing, dump=dump) for a in argv))
    assert said == "torch not imported 2", (said, err)
    assert err == f"opdiff: error: {missing}: no such file or directory"


@pytest.mark.parametrize("command", [("compare", "{dump}", "{dump}"), ("check", "{dump}")])
def test_an_output_that_is_a_file_is_refused_before_the_work(dump, tmp_path, command):
    out = tmp_path / "report.txt"
    out.write_text("the user's notes\n")
    said, err = _cli(*(a.format(dump=dump) for a in command), "-o", out)
    assert said == "torch not imported 2", (said, err)
    assert err == f"opdiff: error: {out} is a file; pass a directory for the output"
    assert out.read_text() == "the user's notes\n"


def test_the_library_refuses_a_file_output_before_it_reads_a_dump(dump, tmp_path):
    out = tmp_path / "report.txt"
    out.write_text("x")
    # the golden does not exist: had the compare started, that would be the error
    with pytest.raises(ConfigError, match="is a file; pass a directory for the output"):
        opdiff.compare(dump, tmp_path / "no_such_dump", output_path=out)
    assert out.read_text() == "x"
