"""The user's line a compiled graph node names is shown with the text the dumps hold for it,
never read from the file the dump names (a dump is untrusted: SECURITY.md, and
ARCHITECTURE.md's `source_context` row)."""
from __future__ import annotations

import json
import shutil

import opdiff

AOT = "aot_eager"
SECRET = "API_TOKEN = 'do-not-print-me'"


def test_a_compiled_culprits_line_is_never_read_from_the_path_the_dump_names(compiled_step,
                                                                          tmp_path):
    target, golden = compiled_step("L2", AOT, "silu:1"), compiled_step("L2")
    secret = tmp_path / "secret.py"
    secret.write_text(SECRET + "\n")
    forged = tmp_path / "forged"
    shutil.copytree(target.path, forged)
    records = forged / "step0" / "rank0" / "records.jsonl"
    lines = []
    for line in records.read_text().splitlines():
        r = json.loads(line)
        if r["name"] == "Aten.silu.1.forward":
            r["compiled"]["source"] = [str(secret), 1]
        lines.append(json.dumps(r))
    records.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    result = opdiff.compare(str(forged), str(golden.path), str(out), progress=False)
    first = result.first_divergence
    assert first is not None and first.name == "Aten.silu.1.forward", first
    assert first.location is not None and first.location.file == str(secret)
    assert "do-not-print-me" not in first.location.code
    for written in out.rglob("*"):
        if written.is_file():
            assert "do-not-print-me" not in written.read_text(errors="replace"), written


def test_a_compiled_culprits_line_text_comes_from_the_dumps(compiled_step, tmp_path):
    result = opdiff.compare(str(compiled_step("L2", AOT, "silu:1").path),
                            str(compiled_step("L2").path), str(tmp_path / "out"), progress=False)
    first = result.first_divergence
    assert first is not None and first.location is not None
    assert first.location.file.endswith("activations.py")
    assert first.location.code     # the eager run's stacks hold that line
