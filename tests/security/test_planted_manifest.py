"""A manifest opdiff did not write for this folder is not a delete list: someone who can write into
OUT (a shared folder, an unpacked archive) knows the size, sha256 and inode of the user's files
without reading them, and an older opdiff's manifest is not sealed. Real CLI runs in child
processes, with their own key folder; hostile manifests are made here."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from opdiff.report import outputs

from outputs_kit import cli, write_dump

OPS = ["Functional.conv2d", "Functional.relu", "Functional.linear"]
LICENSE = b"Permission is hereby granted, free of charge, to any person obtaining a copy\n"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    return write_dump(root / "target", OPS, wrong=1), write_dump(root / "golden", OPS)


@pytest.fixture
def state(tmp_path):
    """A key folder of this test's own (the user's state dir)."""
    return {"XDG_STATE_HOME": str(tmp_path / "state")}


def compare(dumps, out, state):
    return cli("compare", dumps[0], dumps[1], "-o", out, "--no-progress", extra_env=state)


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): "dir" if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*")) if p.name != outputs.MANIFEST}


def users_files(out: Path) -> dict[str, dict]:
    """The user's files in OUT, and a record of each that the old proof accepted: size+sha256 of
    known contents, and dev/inode (stat needs no read permission) of the rest."""
    out.mkdir(parents=True)
    (out / "empty.txt").write_bytes(b"")
    (out / "LICENSE").write_bytes(LICENSE)
    (out / "id_ed25519").write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    os.chmod(out / "id_ed25519", 0o600)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "epoch1.pt").write_bytes(b"\x01" * 64)
    records = {}
    for name in ("empty.txt", "LICENSE", "id_ed25519", "checkpoints", "checkpoints/epoch1.pt"):
        st = os.stat(out / name)
        rec = {"type": "dir" if stat.S_ISDIR(st.st_mode) else "file",
               "dev": st.st_dev, "ino": st.st_ino}
        if name in ("empty.txt", "LICENSE"):
            data = (out / name).read_bytes()
            rec.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        records[name] = rec
    return records


@pytest.mark.parametrize("form", ["format 2", "format 3, forged seal"])
def test_a_planted_manifest_deletes_none_of_the_users_files(dumps, tmp_path, state, form):
    out = tmp_path / "out"
    records = users_files(out)
    manifest: dict = {"written_by": "opdiff", "format": 2, "entries": records}
    if form != "format 2":
        st = os.stat(out)
        manifest.update(format=3, folder={"dev": st.st_dev, "ino": st.st_ino}, mac="0" * 64)
    (out / outputs.MANIFEST).write_text(json.dumps(manifest))
    before = snapshot(out)
    done = compare(dumps, out, state)
    assert done.returncode == 0, done.stderr
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k in before} == before
    assert stat.S_IMODE(os.stat(out / "id_ed25519").st_mode) == 0o600


def test_a_sealed_manifest_copied_beside_the_users_links_proves_nothing(dumps, tmp_path, state):
    """`cp -al out backup`: the backup's files are the same inodes with the same bytes; the
    manifest copied with them was sealed for `out`, not for `backup`."""
    out, backup = tmp_path / "out", tmp_path / "backup"
    assert compare(dumps, out, state).returncode == 0
    backup.mkdir()
    for p in out.iterdir():
        if p.is_file() and p.name != outputs.LOCK:
            os.link(p, backup / p.name)
    before = snapshot(backup)
    done = compare(dumps, backup, state)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "proves nothing" in done.stderr and "choose another -o or remove it" in done.stderr
    assert snapshot(backup) == before


def test_an_older_opdiffs_folder_is_refused_not_emptied(dumps, tmp_path, state):
    out = tmp_path / "out"
    assert compare(dumps, out, state).returncode == 0
    sealed = json.loads((out / outputs.MANIFEST).read_text())
    (out / outputs.MANIFEST).write_text(json.dumps(      # what opdiff 0.x wrote: no seal
        {"written_by": "opdiff", "format": 2, "entries": sealed["entries"]}))
    before = snapshot(out)
    done = compare(dumps, out, state)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "older opdiff" in done.stderr, done.stderr
    assert snapshot(out) == before
    # its own folder, sealed by this opdiff, is reused as before
    (out / outputs.MANIFEST).unlink()
    for p in out.iterdir():
        p.unlink()
    assert compare(dumps, out, state).returncode == 0
    first = {p.name for p in out.glob("compare_result_*.csv")}
    done = compare(dumps, out, state)
    assert done.returncode == 0, done.stderr
    assert len(list(out.glob("compare_result_*.csv"))) == 1 and (out / "summary.json").is_file()
    assert first  # the first run's CSV was there to replace


def test_a_key_that_is_not_private_is_never_used(dumps, tmp_path):
    """A key anyone could read (or a link to one) would let them seal a manifest: opdiff uses
    neither, says so, and then reuses no folder rather than trust an unsealed manifest."""
    shared = tmp_path / "shared"
    (shared / "opdiff").mkdir(parents=True)
    (shared / "opdiff" / "outputs.key").write_bytes(b"k" * 32)
    os.chmod(shared / "opdiff" / "outputs.key", 0o644)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    uid = os.getuid()
    (tmp / f"opdiff-{uid}").symlink_to(shared / "opdiff")
    env = {"XDG_STATE_HOME": str(shared), "TMPDIR": str(tmp)}
    out = tmp_path / "out"
    users_files(out)
    first = compare(dumps, out, env)
    assert first.returncode == 0, first.stderr
    assert "cannot keep its key" in first.stderr
    before = snapshot(out)
    again = compare(dumps, out, env)
    assert again.returncode == 2 and "summary.json" in again.stderr, again.stderr
    assert snapshot(out) == before
