import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))   # the seed-family models in seed_models.py


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The seeds use relative paths: run each transcription in its own empty directory."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    from opdiff.compat import ptdbg_ascend
    ptdbg_ascend.set_dump_switch("OFF")    # a failed test must not leave recording on

