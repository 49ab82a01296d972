"""`opdiff fp8-rank` as a user runs it: the quantize ops named or cleared, the GEMMs ranked,
JSON, exit codes (1 with --fail-on-divergence on a wrong scale, 2 on bad input)."""
from __future__ import annotations

import json

from opdiff.cli import main

UP = "model.layers.1.mlp.up_proj"


class _Done:
    def __init__(self, returncode, captured):
        self.returncode, self.stdout, self.stderr = returncode, captured.out, captured.err


def _run(capsys, *args):
    capsys.readouterr()
    code = main(["fp8-rank", *map(str, args)])
    return _Done(code, capsys.readouterr())


def test_wrong_scale_named_and_fails_on_request(fp8_dump, capsys):
    dump = fp8_dump("fp8", "wrong:" + UP)
    done = _run(capsys, dump, "--top", "3")
    assert done.returncode == 0, done.stderr
    assert "1 of 28 quantize op(s) outside" in done.stdout and UP in done.stdout
    assert "clipped at +-448" in done.stdout
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith("1.")]
    assert lines and UP in lines[0]        # the clipped GEMM loses the most
    assert _run(capsys, dump, "--fail-on-divergence").returncode == 1


def test_healthy_and_what_if_json(fp8_dump, capsys):
    done = _run(capsys, fp8_dump("fp8"), "--fail-on-divergence")
    assert done.returncode == 0 and "28 quantize op(s), each within" in done.stdout
    done = _run(capsys, fp8_dump("bf16"), "--json", "--format", "e5m2", "--granularity", "row")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["quantize_ops"] == [] and len(data["gemms"]) == 10
    assert data["gemms"][0]["how"] == "what-if float8_e5m2 per row"


def test_bad_input_is_one_line_and_exit_2(fp8_dump, tmp_path, capsys):
    for args in ([tmp_path / "missing"], [fp8_dump("bf16"), "--format", "bf16"],
                 [fp8_dump("bf16"), "--top", "0"]):
        done = _run(capsys, *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
