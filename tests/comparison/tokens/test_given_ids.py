"""Input ids given in a file (`--token-ids`, `compare(token_ids=...)`) for statistics dumps,
which save no ids: the layouts become known. A padded batch against the sequence alone is
"inconclusive" naming the matched rows and why statistics cannot be cut to them (before: only
"neither dump holds saved input ids"); the same rows in another order are compared as recorded,
and said to be; ids that do not fit a dump, or a bad file, are one line and exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import opdiff
from opdiff.comparison.result import Note, note_kind
from opdiff.comparison.tokens.given import load_token_ids
from opdiff.errors import OpdiffError

from tokenkit import batch


def _rows(layout):
    ids, mask = batch(layout)
    return ids.tolist(), (mask.tolist() if mask is not None else None)


def _file(tmp_path, target, golden, name="ids.json"):
    (t_ids, t_mask), (g_ids, g_mask) = _rows(target), _rows(golden)
    data = {"target": t_ids, "golden": g_ids}
    data.update({k: v for k, v in (("target_mask", t_mask), ("golden_mask", g_mask)) if v})
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _notes(result, kind):
    return [str(n) for n in result.notes if note_kind(n) == kind]


def test_a_padded_batch_against_alone_names_the_rows_it_cannot_cut(token_dump, tmp_path):
    result = opdiff.compare(token_dump("right", task="statistics"),
                            token_dump("alone", task="statistics"), progress=False,
                            token_ids=_file(tmp_path, "right", "alone"))
    said = " ".join(_notes(result, Note.INCONCLUSIVE))
    assert "golden row 0 positions 0-11 = target row 0 positions 0-11 (same ids)" in said
    assert "cannot be cut to these tokens" in said and "ids.json" in said


def test_the_same_rows_in_another_order_are_compared_as_recorded(token_dump, tmp_path):
    result = opdiff.compare(token_dump("right_short", task="statistics"),
                            token_dump("right", task="statistics"), progress=False,
                            token_ids=_file(tmp_path, "right_short", "right"))
    assert result.first_divergence is None and not _notes(result, Note.INCONCLUSIVE)
    assert result.counts["error"] == result.counts["warning"] == 0
    assert "the same rows of tokens in another order" in " ".join(_notes(result, Note.PAIRING))


def test_ids_that_do_not_fit_the_dump_are_one_line(token_dump, tmp_path):
    with pytest.raises(OpdiffError, match="the target's ids are 1 x 12, its dump's 2 x 12"):
        opdiff.compare(token_dump("right", task="statistics"),
                       token_dump("alone", task="statistics"), progress=False,
                       token_ids=_file(tmp_path, "alone", "alone"))


@pytest.mark.parametrize("text,said", [
    ("{not json", "not JSON"), ('{"target": [[1, 2]]}', '"target" and "golden"'),
    ('{"target": [[1, 2], [3]], "golden": [[1]]}', "row 1 holds 1 ids, row 0 2"),
    ('{"target": [[1, 2]], "golden": [[1]], "target_mask": [[1, 2]]}', "not 0 or 1")])
def test_a_bad_file_is_one_line(tmp_path, text, said):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(OpdiffError, match=said):
        load_token_ids(path)


def test_cli_token_ids(token_dump, tmp_path):
    target, golden = token_dump("right", task="statistics"), token_dump("alone", task="statistics")
    bad = tmp_path / "bad.json"
    bad.write_text('{"target": [[1]]}')
    env = dict(os.environ)
    run = [sys.executable, "-m", "opdiff.cli", "compare", str(target), str(golden), "--no-progress"]
    done = subprocess.run([*run, "--token-ids", str(bad)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("opdiff: error: ") and "bad.json" in done.stderr
    good = _file(tmp_path, "right", "alone")
    done = subprocess.run([*run, "--token-ids", str(good)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
