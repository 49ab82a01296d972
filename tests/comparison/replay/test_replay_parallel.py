"""Replayer.judge_many: the same verdicts in two processes as in one, cached for judge(); a
compare with OPDIFF_REPLAY_JOBS=2 gives the one-process answer."""
import re

import pytest

import opdiff
from opdiff.comparison.replay import Replayer, replay_jobs
from opdiff.errors import ConfigError
from opdiff.store.reader import open_dump
from replay_models import run


def test_judge_many_in_two_processes_matches_judge(tmp_path):
    run("cnn", tmp_path / "d", bf16=True, fault=dict(op="Functional.conv2d", call=2,
                                                     phase="backward", scale=1.02))
    dump = open_dump(tmp_path / "d" / "step0" / "rank0")
    names = [r["name"] for r in dump.records() if r.get("kind") == "api"]
    parallel = Replayer(dump).judge_many(names, jobs=2)
    serial = Replayer(dump)
    for name in names:
        one, many = serial.judge(name), parallel[name]
        assert (one.replayed, one.culprit, one.reason) == (many.replayed, many.culprit, many.reason)
        assert [t.error for t in one.tensors] == [t.error for t in many.tensors]
    assert parallel["Functional.conv2d.2.backward"].culprit
    assert sum(v.culprit for v in parallel.values()) == 1


def _result(result):
    notes = [n for n in result.notes if not n.startswith("replayed")]     # (it says how long)
    return result.rows, result.first_divergence, notes


@pytest.mark.slow
def test_compare_with_replay_jobs_gives_the_one_process_answer(tmp_path, monkeypatch):
    # bf16 with a 2% backward fault: the walk replays the forward ops before the first
    # backward candidate, a few ahead in two processes.
    run("cnn", tmp_path / "g")
    run("cnn", tmp_path / "t", bf16=True, fault=dict(op="Functional.conv2d", call=2,
                                                     phase="backward", scale=1.02))
    monkeypatch.setenv("OPDIFF_REPLAY_JOBS", "1")
    one = opdiff.compare(tmp_path / "t", tmp_path / "g")
    monkeypatch.setenv("OPDIFF_REPLAY_JOBS", "2")
    two = opdiff.compare(tmp_path / "t", tmp_path / "g")
    assert one.first_divergence.name == "Functional.conv2d.2.backward"
    assert _result(two) == _result(one)
    replayed = [n for n in two.notes if n.startswith("replayed")]
    assert replayed and int(replayed[0].split()[1]) > 5       # the walk did replay ahead
    every = opdiff.compare(tmp_path / "t", tmp_path / "g", replay="all")
    monkeypatch.setenv("OPDIFF_REPLAY_JOBS", "1")
    assert _result(opdiff.compare(tmp_path / "t", tmp_path / "g", replay="all")) == _result(every)


def test_bad_replay_jobs_is_a_config_error(monkeypatch):
    monkeypatch.setenv("OPDIFF_REPLAY_JOBS", "many")
    with pytest.raises(ConfigError, match="OPDIFF_REPLAY_JOBS"):
        replay_jobs()
    monkeypatch.setenv("OPDIFF_REPLAY_JOBS", "3")
    assert replay_jobs() == 3


def _everything(result):
    """Rows, divergence and notes, with the replay's timing taken out of its note."""
    notes = [re.sub(r"; \d+ more replayed ahead[^;]*", "", re.sub(r" in [0-9.]+ s", "", n))
             for n in result.notes]
    return result.rows, result.first_divergence, notes


@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, dict(op="Functional.conv2d", call=2, phase="backward",
                                              scale=1.02),
                                   dict(op="Functional.batch_norm", call=1, scale=1.02)])
def test_compare_with_a_replay_thread_gives_the_one_thread_answer(tmp_path, monkeypatch, fault):
    """`Replayer.prefetch`: replaying on a second thread while the first measures (and the
    first helping once it has measured) changes no row, verdict or note, healthy or not."""
    run("cnn", tmp_path / "g")
    run("cnn", tmp_path / "t", bf16=True, fault=fault)
    monkeypatch.setenv("OPDIFF_REPLAY_THREADS", "1")
    one = opdiff.compare(tmp_path / "t", tmp_path / "g")
    monkeypatch.setenv("OPDIFF_REPLAY_THREADS", "2")
    two = opdiff.compare(tmp_path / "t", tmp_path / "g")
    assert _everything(two) == _everything(one)
    fd = two.first_divergence
    if fault is None:
        assert fd is None, two.verdict
    else:
        assert fd is not None and fd.op == fault["op"], two.verdict


def test_prefetch_replays_each_record_once_with_judges_verdicts(tmp_path, monkeypatch):
    """The thread ahead and the caller share the queue: every record is replayed once (the
    summary counts it once) and its verdict is the serial one."""
    monkeypatch.setenv("OPDIFF_REPLAY_THREADS", "2")
    run("cnn", tmp_path / "d", bf16=True, fault=dict(op="Functional.relu", call=1, scale=1.05))
    dump = open_dump(tmp_path / "d" / "step0" / "rank0")
    names = [r["name"] for r in dump.records()]
    ahead = Replayer(dump)
    assert ahead.prefetch(names)
    got = {n: ahead.judge(n) for n in reversed(names)}     # the caller takes the other end
    ahead.close()
    serial = Replayer(dump)
    for name in names:
        one = serial.judge(name)
        assert (one.replayed, one.culprit, one.reason) == (got[name].replayed, got[name].culprit,
                                                           got[name].reason)
        assert [t.error for t in one.tensors] == [t.error for t in got[name].tensors]
    assert len(ahead.done) == len(serial.done)
    assert sum(v.culprit for v in got.values()) >= 1
    monkeypatch.setenv("OPDIFF_REPLAY_THREADS", "1")
    assert not Replayer(dump).prefetch(names)          # one thread: nothing started


@pytest.mark.skipif(not __import__("os").path.exists("/proc/loadavg"), reason="Linux only")
def test_the_second_thread_waits_for_an_idle_core(monkeypatch):
    """Default: a second replay thread only where a core is idle now (this process counts as
    running, so one core is never enough); OPDIFF_REPLAY_THREADS decides when set."""
    from opdiff.comparison.replay import _idle_core, replay_threads

    assert not _idle_core(1) and _idle_core(10 ** 6)
    monkeypatch.setenv("OPDIFF_REPLAY_THREADS", "2")
    assert replay_threads() == 2
    monkeypatch.delenv("OPDIFF_REPLAY_THREADS")
    assert replay_threads() in (1, 2)
