"""One CLI language: the same flags mean the same thing in every command, older spellings
still work, `-v` goes before or after the command, and `opdiff onnx` takes TARGET first."""
import argparse

import pytest

from opdiff.cli import COMMANDS, build_parser
from opdiff.commands.onnx import _models
from opdiff.errors import ConfigError


def parse(*argv):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("command", [c for c in COMMANDS])
def test_v_is_accepted_after_every_command(command):
    positional = {"compare": ["T", "G"], "check": ["D"], "trend": ["T"], "overflow": ["D"],
                  "onnx": ["T.onnx", "G.onnx"], "explain": ["OUT"],
                  "query": ["OUT", 'result == "error"'], "isolate": ["T", "G"],
                  "calibrate": ["A", "B", "-o", "N"], "fp8-rank": ["RUN"]}.get(command, [])
    assert parse(command, *positional, "-v").verbose is True
    assert parse("-v", command, *positional).verbose is True
    assert parse(command, *positional).verbose is False


@pytest.mark.parametrize("argv, dest", [
    (["compare", "T", "G"], "fail_on_divergence"),
    (["trend", "T"], "fail_on_divergence"),
    (["onnx", "T.onnx", "G.onnx"], "fail_on_divergence"),
    (["check", "D"], "fail_on_failure"),
    (["overflow", "D"], "fail_on_overflow"),
])
def test_fail_on_divergence_everywhere_and_old_spellings_kept(argv, dest):
    assert getattr(parse(*argv, "--fail-on-divergence"), dest) is True
    assert getattr(parse(*argv), dest) is False
    old = {"fail_on_failure": "--fail-on-failure", "fail_on_overflow": "--fail-on-overflow"}
    if dest in old:
        assert getattr(parse(*argv, old[dest]), dest) is True


def test_jobs_and_progress_spelled_alike_in_compare_and_check():
    for argv in (["compare", "T", "G"], ["check", "D"]):
        for flag in ("--jobs", "-j"):
            jobs = parse(*argv, flag, "3")
            assert int(getattr(jobs, "replay_jobs", getattr(jobs, "jobs", None))) == 3
        assert parse(*argv, "--progress").progress is True
        assert parse(*argv, "--no-progress").progress is False
        assert parse(*argv).progress is None
    assert parse("compare", "T", "G", "--replay-jobs", "2").replay_jobs == "2"


def _onnx(*argv):
    return _models(parse("onnx", *argv), ConfigError)


def test_onnx_takes_target_first_like_compare_and_names_by_flag():
    assert _onnx("t.onnx", "g.onnx") == ("t.onnx", "g.onnx")
    # the old GOLDEN-first habit, spelled out by name, in any order
    assert _onnx("--golden", "g.onnx", "--target", "t.onnx") == ("t.onnx", "g.onnx")
    assert _onnx("--golden", "g.onnx", "t.onnx") == ("t.onnx", "g.onnx")
    assert _onnx("--target", "t.onnx", "g.onnx") == ("t.onnx", "g.onnx")
    assert _onnx("-gm", "g.onnx", "-om", "t.onnx") == ("t.onnx", "g.onnx")     # msit compare's flags
    assert _models(parse("onnx", "--torch", "m.py:f", "t.onnx"), ConfigError) == ("t.onnx", None)
    for bad in (["t.onnx"], ["a", "b", "c"], ["--golden", "g", "--target", "t", "x"]):
        with pytest.raises(ConfigError, match="give two models"):
            _onnx(*bad)


def test_help_says_the_order():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = sub.choices["onnx"].format_help()
    assert "TARGET comes first" in text and "--golden" in text
