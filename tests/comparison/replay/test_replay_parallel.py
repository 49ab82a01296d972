"""Replayer.judge_many: the same verdicts in two processes as in one, cached for judge()."""
from opdiff.comparison.replay import Replayer
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
