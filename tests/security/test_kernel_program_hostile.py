"""A dump is untrusted input, the programs stored with compiled kernels included: `opdiff check`
replays a kernel record's program (`opdiff.comparison.replay.kernels`) only where every step is
an op on replay's allow-list, every reference names a saved input or an earlier step and every
argument decodes as replay's own; otherwise the kernel is "not checked: untrusted: ...", nothing
runs, and the rest of the dump is still checked. A real small dump gets kernel records whose
programs are hostile or malformed, and the real CLI checks it in a subprocess."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch

import opdiff

from pickle_payload import CLI, SRC
from pickle_payload import Payload as _Payload


def _in(i: int) -> dict:
    return {"ref": "input", "index": i}


def _step(i: int) -> dict:
    return {"ref": "step", "index": i}


def _programs(payload: Path) -> dict[str, object]:
    silu = [{"op": "Aten.sigmoid", "args": [_in(0)], "kwargs": {}},
            {"op": "Aten.mul", "args": [_in(0), _step(0)], "kwargs": {}}]
    out = [{"output": 0, "value": _step(1)}]
    return {
        "legit": {"steps": silu, "outputs": out},
        "load": {"steps": [{"op": "Torch.load", "args": [{"type": "str", "value": str(payload)}],
                            "kwargs": {"weights_only": {"type": "bool", "value": False}}},
                           *silu], "outputs": [{"output": 0, "value": _step(2)}]},
        "forward_ref": {"steps": [{"op": "Aten.sigmoid", "args": [_step(1)], "kwargs": {}},
                                  silu[1]], "outputs": out},
        "input_out_of_range": {"steps": [silu[0], {"op": "Aten.mul", "args": [_in(7), _step(0)],
                                                   "kwargs": {}}], "outputs": out},
        "path_argument": {"steps": [{"op": "Aten.add", "args": [
            _in(0), {"type": "str", "value": str(payload)}], "kwargs": {}}],
            "outputs": [{"output": 0, "value": _step(0)}]},
        "output_out_of_range": {"steps": silu, "outputs": [{"output": 3, "value": _step(1)}]},
        "not_a_mapping": [["Torch.load", str(payload)]],
        "deep": {"steps": [{"op": "Aten.cat", "args": [
            {"type": "list", "items": [{"type": "list", "items": [{"type": "list", "items": [
                {"type": "list", "items": [{"type": "list", "items": [{"type": "list", "items": [
                    _in(0)]}]}]}]}]}]}], "kwargs": {}}],
            "outputs": [{"output": 0, "value": _step(0)}]},
    }


def _dump(tmp_path: Path, payload: Path) -> tuple[Path, dict[str, str]]:
    """A real dump of a linear then silu, with one kernel record per program, each a copy of
    the silu record (its saved input and output) holding that program."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with opdiff.dump(model, tmp_path / "d", level="mix", task="tensor"):
        torch.nn.functional.silu(model(torch.randn(2, 4))).sum()
    dump = tmp_path / "d" / "step0" / "rank0"
    recs = [json.loads(line) for line in (dump / "records.jsonl").read_text().splitlines()]
    silu = next(r for r in recs if r["op"] == "Functional.silu")
    seq = max(r.get("seq", 0) for r in recs)
    names = {}
    with open(dump / "records.jsonl", "a") as f:
        for i, (case, program) in enumerate(_programs(payload).items()):
            seq += 1
            name = f"Inductor.cpp_fused_silu_0.{i}.forward"
            names[case] = name
            f.write(json.dumps(dict(silu, name=name, op="Inductor.cpp_fused_silu_0",
                                    kind="kernel", seq=seq, program=program)) + "\n")
    return dump, names


def test_hostile_kernel_programs_are_refused_and_run_nothing(tmp_path):
    marker, payload = tmp_path / "PWNED", tmp_path / "payload.pt"
    with open(payload, "wb") as f:
        pickle.dump(_Payload(str(marker)), f)
    dump, names = _dump(tmp_path, payload)
    out = tmp_path / "check_out"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CLI, "check", str(dump), "-o", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists(), "replay unpickled a payload (torch.load ran)"
    summary = json.loads((out / "summary.json").read_text())
    reasons = {o["name"]: o["reason"] for o in summary["not_checked"]}
    prefix = "a kernel Inductor generated: "
    assert names["legit"] not in reasons and summary["failed"] == 0, summary
    assert "step 0: untrusted: Torch.load is not an op replay trusts" in reasons[names["load"]]
    for case in ("forward_ref", "input_out_of_range"):
        assert reasons[names[case]].startswith(prefix + "untrusted: the kernel's stored program "
                                               "refers to"), reasons[names[case]]
    assert "untrusted: input.1 is a string argument" in reasons[names["path_argument"]]
    assert reasons[names["output_out_of_range"]] == (
        prefix + "untrusted: the kernel's stored program has a malformed output "
        "({'output': 3, 'value': {'ref': 'step', 'index': 1}})")
    assert reasons[names["not_a_mapping"]] == (
        prefix + "untrusted: the kernel's stored program is not a mapping")
    assert "untrusted: the kernel's stored program has a malformed argument" in \
        reasons[names["deep"]]
    # the real ops, and the kernel whose program is legitimate, are checked, and pass
    assert summary["checked"] >= 3 and summary["failed"] == 0
