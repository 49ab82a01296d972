"""Reading streams: what a crash leaves is read, what is broken is refused with the file and
line, and the fast path reads exactly what the careful one does."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opdiff.errors import StreamError
from opdiff.monitor.stream import BINARY, StreamWriter
from opdiff.trend import read_run
from opdiff.trend.reader import _CHUNK


def _stream(root, rows, columns=("loss", "a:fwd_norm"), binary=False, missing=None):
    """Write a stream; without `binary`, only its CSV (the text path of the reader)."""
    writer = StreamWriter(root / "rank0")
    writer.write_meta({"format": "opdiff-monitor", "version": 1, "rank": 0,
                       "modules": [{"name": "a", "type": "Linear"}]})
    writer.open(list(columns))
    for step, row in enumerate(rows):
        writer.append(step, np.asarray(row, dtype=np.float64),
                      None if missing is None else missing[step])
    writer.close()
    if not binary:
        (root / "rank0" / BINARY).unlink()
    return root / "rank0" / "metrics.csv"


def test_a_line_cut_short_by_a_crash_is_dropped(tmp_path):
    path = _stream(tmp_path, [[1.0, 2.0], [1.5, 2.5]])
    with open(path, "ab") as f:
        f.write(b"2,1.2")                 # the kill came mid-line
    stream = read_run(tmp_path).ranks[0]
    assert list(stream.steps) == [0, 1] and stream.partial_line


def test_a_broken_line_in_the_middle_is_refused_with_its_line(tmp_path):
    path = _stream(tmp_path, [[1.0, 2.0], [1.5, 2.5], [1.2, 2.2]])
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"1,1.5"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(StreamError, match=r"metrics.csv:3: 2 fields where the header has 3"):
        read_run(tmp_path)
    lines[2] = b"1,1.5,banana"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(StreamError, match=r"metrics.csv:3: field 3 is b'banana'"):
        read_run(tmp_path)


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"step,loss\n", "no complete step"),
    (b"loss,step\n1,0\n", "not a monitor header"),
])
def test_empty_and_foreign_files_are_refused(tmp_path, content, message):
    _stream(tmp_path, [[1.0, 2.0]])
    (tmp_path / "rank0" / "metrics.csv").write_bytes(content)
    with pytest.raises(StreamError, match=message):
        read_run(tmp_path)


def test_missing_directories_and_meta(tmp_path):
    with pytest.raises(StreamError, match="does not exist"):
        read_run(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StreamError, match="holds no monitor stream"):
        read_run(tmp_path / "empty")
    _stream(tmp_path / "run", [[1.0, 2.0]])
    (tmp_path / "run" / "rank0" / "meta.json").write_text("{not json")
    with pytest.raises(StreamError, match="not valid JSON"):
        read_run(tmp_path / "run")
    (tmp_path / "run" / "rank0" / "meta.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(StreamError, match="not a monitor stream"):
        read_run(tmp_path / "run")


def test_one_rank_directory_is_a_run_too(tmp_path):
    _stream(tmp_path, [[1.0, 2.0]])
    assert list(read_run(tmp_path / "rank0").ranks) == [0]


def test_fast_and_careful_paths_agree(tmp_path):
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((3 * _CHUNK + 7, 5)) * 10.0 ** rng.integers(-8, 8, (1, 5))
    rows[_CHUNK + 3, 2] = np.nan        # one chunk goes the careful way
    rows[2 * _CHUNK + 1, 4] = np.inf
    _stream(tmp_path, rows, columns=("loss", "a:fwd_norm", "a:fwd_max", "a:bwd_norm", "b"))
    stream = read_run(tmp_path).ranks[0]
    expected = rows.astype(np.float32)
    assert np.array_equal(stream.values, expected, equal_nan=True)
    assert list(stream.steps) == list(range(len(rows)))


def test_the_binary_rows_hold_exactly_the_csv_values(tmp_path):
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((40, 4)) * 1e3
    rows[5, 1], rows[9, 2] = np.nan, -np.inf
    missing = np.zeros((40, 4), dtype=bool)
    missing[7, 3] = True
    _stream(tmp_path / "text", rows, columns=("loss", "a:fwd_norm", "a:fwd_max", "b"),
            missing=missing)
    _stream(tmp_path / "bin", rows, columns=("loss", "a:fwd_norm", "a:fwd_max", "b"),
            missing=missing, binary=True)
    text, binary = read_run(tmp_path / "text").ranks[0], read_run(tmp_path / "bin").ranks[0]
    assert np.array_equal(text.values, binary.values, equal_nan=True)
    assert np.array_equal(text.missing, binary.missing) and binary.missing[7, 3]
    assert not binary.missing[5, 1] and np.isnan(binary.values[5, 1])     # measured NaN


def test_a_killed_binary_row_is_dropped_and_a_foreign_one_falls_back_to_the_csv(tmp_path):
    _stream(tmp_path, [[1.0, 2.0], [1.5, 2.5], [1.2, 2.2]], binary=True)
    path = tmp_path / "rank0" / BINARY
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x80")      # part of a fourth row
    stream = read_run(tmp_path).ranks[0]
    assert list(stream.steps) == [0, 1, 2] and stream.partial_line
    path.write_bytes(b"\xff" * 12 * 5)   # five rows of NaN steps: not the monitor's
    assert list(read_run(tmp_path).ranks[0].steps) == [0, 1, 2]
