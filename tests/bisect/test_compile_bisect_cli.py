"""`opdiff compile-bisect -- CMD`: the user's unchanged script, each run a fresh process, judged
by the gradients of its first optimizer step; bad input is one line and exit 2."""
from __future__ import annotations

import os
import re
import sys

import pytest

from bisectkit import SCRIPT
from runkit import SRC, run


@pytest.fixture()
def script(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def bisect(cwd, *cmd, timeout=900):
    return run(["-m", "opdiff", "compile-bisect", "--", *cmd], cwd, timeout=timeout)


def losses(cwd, **env):
    out = run(["train.py", "--wrong-silu"], cwd, **env)
    assert out.returncode == 0, out.stderr
    return [float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("loss")]


@pytest.mark.slow
def test_a_wrong_silu_decomposition_is_named_and_its_settings_reproduce_it(script):
    out = bisect(script, sys.executable, "train.py", "--wrong-silu")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("the difference appears with Inductor's decompositions"), out.stdout
    assert "(backend aot_eager_decomp_partition), subsystem decomposition, application #" in first
    assert first.endswith(": aten.silu.default")
    n = int(re.search(r"application #(\d+)", first).group(1))
    assert "checked:" in out.stdout
    differs = (f"TORCH_BISECT_BACKEND=aot_eager_decomp_partition TORCH_BISECT_SUBSYSTEM=decomposition "
               f"TORCH_BISECT_MAX={n}")
    agrees = differs[:-len(str(n))] + str(n - 1)
    assert re.search(re.escape(differs) + r"\s+-> differs", out.stdout), out.stdout
    assert re.search(re.escape(agrees) + r"\s+-> agrees", out.stdout), out.stdout
    assert "run 3: aot_eager_decomp_partition: differs" in out.stderr     # progress, one line a run
    # The printed settings, typed by hand before the unchanged script: its printed losses.
    eager = losses(script, TORCH_COMPILE_DISABLE="1")
    with_bug = losses(script, TORCH_BISECT_BACKEND="aot_eager_decomp_partition",
                      TORCH_BISECT_SUBSYSTEM="decomposition", TORCH_BISECT_MAX=str(n))
    without = losses(script, TORCH_BISECT_BACKEND="aot_eager_decomp_partition",
                     TORCH_BISECT_SUBSYSTEM="decomposition", TORCH_BISECT_MAX=str(n - 1))
    assert abs(with_bug[0] / eager[0] - 1) > 1e-4
    assert abs(without[0] / eager[0] - 1) < 1e-6


def test_no_command_is_one_line_and_exit_2(tmp_path):
    out = bisect(tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "opdiff: error: compile-bisect needs a command after '--', e.g. opdiff compile-bisect -- "
        "python train.py"]


@pytest.mark.parametrize("code, says", [
    ("import sys; print('bad data'); sys.exit(3)", "fails in eager (torch.compile disabled): exit status 3: bad data"),
    ("print('no training here')", "made no optimizer step 0 (torch.optim) before it ended: no training here"),
])
def test_a_command_that_fails_or_trains_nothing_in_eager_is_refused(tmp_path, code, says):
    out = bisect(tmp_path, sys.executable, "-c", code)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines


@pytest.mark.slow
def test_an_unseeded_script_is_not_reproducible(script):
    (script / "unseeded.py").write_text(SCRIPT.replace("torch.manual_seed(0)", ""))
    out = bisect(script, "unseeded.py")             # a bare script runs with this Python
    assert out.returncode == 2
    assert out.stderr.strip().startswith("opdiff: error: not reproducible: two eager runs of the "
                                         "command differ"), out.stderr


def test_a_command_that_cannot_start_is_refused(tmp_path):
    out = bisect(tmp_path, "no-such-program-here")
    assert out.returncode == 2
    assert out.stderr.strip() == ("opdiff: error: cannot run 'no-such-program-here': "
                                  "No such file or directory")


def test_bisector_settings_already_set_are_refused(script):
    out = run(["-m", "opdiff", "compile-bisect", "--", sys.executable, "train.py"], script,
              TORCH_BISECT_BACKEND="inductor")
    assert out.returncode == 2
    assert "TORCH_BISECT_BACKEND is set: unset it" in out.stderr


def test_the_probe_takes_the_gradients_of_the_step_asked_for_and_ends_the_run_there(script):
    import json

    from safetensors import safe_open

    from opdiff.bisect.command import SITE_DIR

    out = script / "grads.safetensors"
    done = run(["train.py"], script, PYTHONPATH=os.pathsep.join([SITE_DIR, SRC]),
               TORCH_COMPILE_DISABLE="1",
               OPDIFF_BISECT_PROBE=json.dumps({"out": str(out), "step": 1}))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("loss") == 1           # step 0 ran whole; step 1 stopped at its update
    with safe_open(str(out), "pt") as f:
        assert sorted(f.keys()) == ["grad[0]", "grad[1]", "grad[2]", "grad[3]"]
        assert f.get_tensor("grad[0]").shape == (16, 8)
        assert f.metadata()["frames"] == "0"        # compile disabled: dynamo compiled nothing
