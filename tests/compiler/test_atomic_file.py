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
