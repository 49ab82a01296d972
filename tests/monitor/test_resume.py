"""Monitor(resume_from=S): a run killed with SIGKILL and restarted from its checkpoint at step S
continues the same stream, every step in it exactly once, with the numbers an uninterrupted run
records, and trend reads it like any other run."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

import opdiff
from opdiff.trend import read_run, trend

from .conftest import kill_after, start_python

CHECKPOINT, STOP = 12, 24

TRAIN = textwrap.dedent("""
    import sys, torch
    import opdiff
    from opdiff.demo.trend_runs import TinyTransformer, batches, end_step, next_token_loss

    def main(path, checkpoint, start, stop, save_at=0, progress=None):
        torch.set_num_threads(1)
        opdiff.seed_all(0)
        model = TinyTransformer(blocks=1)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        data = batches(8, seed=1)
        if start:
            state = torch.load(checkpoint)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        mon = opdiff.Monitor(model, path, optimizer=opt, resume_from=start if start else None)
        report = open(progress, "w") if progress else None
        for step in range(start, stop):
            tokens = data[step % len(data)]
            loss = next_token_loss(model(tokens), tokens)
            loss.backward()
            opt.step()
            end_step(loss, opt, mon)
            if step + 1 == save_at:                 # the state the restart begins from
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()},
                           checkpoint)
            if report:
                report.write(f"{step}\\n")
                report.flush()
        mon.close()

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
             sys.argv[6] if len(sys.argv) > 6 else None)
""")


def _python(tmp_path, *args, wait=True):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return start_python(script, *args, wait=wait)


@pytest.mark.slow
def test_a_killed_run_resumed_from_its_checkpoint_has_every_step_once(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    progress = tmp_path / "progress.txt"
    # 1. Train "for ever", checkpointing after step CHECKPOINT-1; SIGKILL it well past that.
    proc = _python(tmp_path, tmp_path / "mon", ckpt, 0, 10 ** 6, CHECKPOINT, progress, wait=False)
    kill_after(proc, progress, CHECKPOINT + 6)
    assert ckpt.is_file()
    killed = read_run(tmp_path / "mon").ranks[0]
    assert killed.steps[-1] >= CHECKPOINT + 5        # steps after the checkpoint were recorded
    # 2. Restart from the checkpoint: the steps the killed run did after it are done again.
    _python(tmp_path, tmp_path / "mon", ckpt, CHECKPOINT, STOP, 0)
    # 3. The same training without a kill, for reference (here: one process start less).
    code: dict = {}
    exec(TRAIN, code)
    threads = torch.get_num_threads()
    try:
        code["main"](tmp_path / "ref", None, 0, STOP)
    finally:
        torch.set_num_threads(threads)

    resumed = read_run(tmp_path / "mon").ranks[0]
    reference = read_run(tmp_path / "ref").ranks[0]
    assert list(resumed.steps) == list(range(STOP))           # none lost, none twice
    assert resumed.columns == reference.columns
    timed = resumed.columns.index("step_time")
    same = [i for i in range(len(resumed.columns)) if i != timed]
    # Bitwise the numbers of the uninterrupted run (the CSV too: it is what pandas reads).
    assert np.array_equal(resumed.values[:, same].view(np.uint32),
                          reference.values[:, same].view(np.uint32))
    csv = (tmp_path / "mon" / "rank0" / "metrics.csv").read_text().splitlines()
    ref_csv = (tmp_path / "ref" / "rank0" / "metrics.csv").read_text().splitlines()
    assert len(csv) == STOP + 1 and [line.split(",")[0] for line in csv[1:]] == \
        [str(s) for s in range(STOP)]
    cut = lambda line: [v for i, v in enumerate(line.split(",")) if i != timed + 1]  # noqa: E731
    assert [cut(line) for line in csv] == [cut(line) for line in ref_csv]
    meta = json.loads((tmp_path / "mon" / "rank0" / "meta.json").read_text())
    assert [r["step"] for r in meta["resumed"]] == [CHECKPOINT]
    assert meta["resumed"][0]["kept_rows"] == CHECKPOINT
    assert meta["modules"] == json.loads((tmp_path / "ref" / "rank0" / "meta.json")
                                         .read_text())["modules"]
    result = trend(tmp_path / "mon", tmp_path / "ref")
    assert result.first_divergence is None and result.verdict == "agree"


def test_resume_without_a_stream_starts_one_at_that_step(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdiff.Monitor(model, tmp_path, optimizer=opt, resume_from=5) as mon:
        assert mon.current_step == 5
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            mon.step()
            opt.zero_grad()
    assert list(read_run(tmp_path).ranks[0].steps) == [5, 6, 7]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_resume_from_must_be_a_step_number(tmp_path, bad):
    from opdiff.errors import ConfigError
    with pytest.raises(ConfigError, match="resume_from"):
        opdiff.Monitor(torch.nn.Linear(2, 2), tmp_path, resume_from=bad)


def test_reopen_drops_rows_from_the_step_on_and_a_torn_last_row(tmp_path):
    from opdiff.monitor.stream import StreamWriter
    directory = tmp_path / "rank0"
    writer = StreamWriter(directory)
    writer.write_meta({"format": "opdiff-monitor", "version": 1, "rank": 0})
    writer.open(["loss", "a:fwd_norm"])
    for step in range(5):
        writer.append(step, np.array([float(step), 10.0 + step]))
    writer.close()
    for name in ("metrics.csv", "metrics.f32"):            # a kill in the middle of a row
        with open(directory / name, "ab") as f:
            f.write(b"5,0.2")
    again = StreamWriter(directory)
    assert again.reopen(3) == ["loss", "a:fwd_norm"] and again.kept_rows == 3
    for step in (3, 4, 5):
        again.append(step, np.array([100.0 + step, 1.0]))
    again.close()
    stream = read_run(tmp_path).ranks[0]
    assert list(stream.steps) == [0, 1, 2, 3, 4, 5] and not stream.partial_line
    assert stream.series("loss").tolist() == [0.0, 1.0, 2.0, 103.0, 104.0, 105.0]
    lines = (directory / "metrics.csv").read_text().splitlines()
    assert lines[0] == "step,loss,a:fwd_norm"
    assert lines[3:] == ["2,2.0,12.0", "3,103.0,1.0", "4,104.0,1.0", "5,105.0,1.0"]


def test_a_resumed_tensorboard_export_shows_every_step_once(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for start, stop in ((0, 5), (3, 6)):        # the first run recorded 3 and 4, then died
        with opdiff.Monitor(model, tmp_path, optimizer=opt, tensorboard=True,
                            resume_from=start or None) as mon:
            for step in range(start, stop):
                loss = model(torch.full((2, 4), float(step))).pow(2).mean()
                loss.backward()
                opt.step()
                mon.step(loss)
                opt.zero_grad()
    acc = EventAccumulator(str(tmp_path / "rank0" / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [0, 1, 2, 3, 4, 5]
    assert [e.value for e in acc.Scalars("loss")] == \
        read_run(tmp_path).ranks[0].series("loss").tolist()
