"""`opdiff demo` arguments and its output directory: --list, unknown scenarios, and never
touching a directory the demo did not write."""
from __future__ import annotations

import json
import os

import pytest

from opdiff.cli import main
from opdiff.demo import workspace
from opdiff.report import outputs
from opdiff.errors import ConfigError

SCENARIOS = ("iadd", "lstm-backward", "fp16-overflow", "bf16-healthy", "wrong-weights", "dropout",
             "trend")


def test_list_names_every_scenario_default_first(capsys):
    assert main(["demo", "--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()
             if line.strip() and not line[0].isspace()]
    assert names == list(SCENARIOS)


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "opdiff demo --scenario lstm-backward" in text
    listed = text[text.index("scenarios:"):].splitlines()[1:]
    assert [line.split()[0] for line in listed if line.startswith("  ") and
            not line.startswith("   ")] == list(SCENARIOS)     # every scenario, in --list order


def test_unknown_scenario_is_bad_input_on_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["demo", "--scenario", "resnet9000", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown demo scenario 'resnet9000'" in err
    assert "iadd" in err and not out.exists()


def test_refuses_a_non_empty_directory_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "results"
    out.mkdir()
    mine = out / "experiment.csv"
    mine.write_text("epoch,loss\n1,0.5\n")
    assert main(["demo", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not written by opdiff" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["experiment.csv"]
    assert mine.read_text() == "epoch,loss\n1,0.5\n"


def test_refuses_a_file(tmp_path, capsys):
    target = tmp_path / "report.txt"
    target.write_text("keep me")
    assert main(["demo", "-o", str(target)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_empty_directory_is_accepted_and_marked(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    with workspace.hold(out) as held:
        assert held == out
        (out / "dump").mkdir()
        (out / "dump" / "records.jsonl").write_text("{}\n")
    assert outputs.written(out) == ["dump", "dump/records.jsonl"]


def test_previous_demo_files_are_replaced_and_nothing_else(tmp_path):
    with workspace.hold(tmp_path / "demo") as out:
        (out / "dump" / "golden").mkdir(parents=True)
        (out / "dump" / "golden" / "records.jsonl").write_text("{}\n")
        outputs.atomic_write_text(out / "summary.json", "{}", "summary.json")
    (out / "notes.md").write_text("my notes")                 # added by the user afterwards
    with workspace.hold(out):
        assert sorted(p.name for p in out.iterdir()) == [outputs.LOCK, outputs.MANIFEST, "notes.md"]
    assert (out / "notes.md").read_text() == "my notes"


def test_a_tampered_manifest_cannot_delete_outside_the_directory(tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"\x00")
    st = os.stat(outside)
    out = tmp_path / "demo"
    out.mkdir()
    rec = {"type": "dir", "dev": st.st_dev, "ino": st.st_ino}
    (out / outputs.MANIFEST).write_text(json.dumps({"written_by": "opdiff", "format": 2, "entries": {
        "../precious": rec, str(outside): rec, "..": rec, ".": rec}}))
    with workspace.hold(out):
        pass
    assert (outside / "data.bin").read_bytes() == b"\x00"


def test_library_raises_config_error_for_bad_output(tmp_path):
    import opdiff.demo

    (tmp_path / "x").write_text("")
    with pytest.raises(ConfigError):
        opdiff.demo.run("iadd", output=tmp_path / "x")


def test_every_listed_scenario_has_a_player():
    from opdiff.demo.catalog import SCENARIOS as catalog

    assert tuple(catalog) == SCENARIOS
    assert all(callable(s.player()) for s in catalog.values())


def test_list_answers_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys\nfrom opdiff.cli import main\nassert main(['demo', '--list']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "bf16-healthy" in proc.stdout
