"""Whole-or-nothing writes with the final mode from the first byte, never through a planted link."""

from __future__ import annotations

import os
import stat

import pytest

from cuvil.compiler import atomic_file
from cuvil.compiler.atomic_file import atomic_write


def test_mode_from_the_first_byte_and_published_whole(tmp_path, monkeypatch):
    seen = []
    real_fdopen = os.fdopen

    def watching_fdopen(fd, *a, **k):
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))  # before one byte is written
        return real_fdopen(fd, *a, **k)

    monkeypatch.setattr(atomic_file.os, "fdopen", watching_fdopen)
    target = tmp_path / "secret.key"
    target.write_bytes(b"old")
    target.chmod(0o644)
    with atomic_write(target, 0o600) as f:
        f.write(b"new secret")
        assert target.read_bytes() == b"old"  # not visible until complete
    assert seen == [0o600] and target.read_bytes() == b"new secret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and os.listdir(tmp_path) == ["secret.key"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write(b"half")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_a_link_at_the_final_name_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "out"
    link.symlink_to(victim)
    with atomic_write(link) as f:
        f.write(b"data")
    assert victim.read_bytes() == b"precious" and not link.is_symlink() and link.read_bytes() == b"data"


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_what_is_not_a_regular_file_is_never_replaced(tmp_path, kind):
    """``cuvil import -o /dev/null`` as root swapped the null device for a regular file."""
    target = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root (the build machines and CI run as root)")
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # a null device of our own
    before = os.lstat(target)
    with pytest.raises(FileExistsError, match="not a regular file"):
        with atomic_write(target) as f:
            f.write(b"x")
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and os.listdir(tmp_path) == ["out"]


def test_files_written_together_stay_as_they_were_when_one_cannot_be(tmp_path):
    """keygen --force wrote the new private key, then failed on the public one: the old pair was lost
    and the public key on disk matched no private key."""
    key, pub = tmp_path / "k.key", tmp_path / "k.pub"
    key.write_bytes(b"old private")
    pub.mkdir()  # the second target cannot be replaced
    with pytest.raises(FileExistsError):
        atomic_file.write_all([(key, b"new private", 0o600), (pub, b"new public", 0o644)])
    assert key.read_bytes() == b"old private" and pub.is_dir()
    assert sorted(os.listdir(tmp_path)) == ["k.key", "k.pub"]
    pub.rmdir()
    atomic_file.write_all([(key, b"new private", 0o600), (pub, b"new public", 0o644)])
    assert key.read_bytes() == b"new private" and pub.read_bytes() == b"new public"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_a_missing_folder_is_named_by_the_file_asked_for(tmp_path):
    """import -o nodir/x.cuvil said 'No such file or directory: nodir/.x.cuvil.<hex>.tmp'."""
    with pytest.raises(FileNotFoundError) as e:
        with atomic_write(tmp_path / "nodir" / "x.cuvil") as f:
            f.write(b"x")
    assert e.value.filename == str(tmp_path / "nodir" / "x.cuvil") and ".tmp" not in str(e.value)
