"""Files named by someone else: a regular file or an OSError at once, reads bounded."""

from __future__ import annotations

import os

import pytest

from cuvil.compiler.regular_file import open_regular, read_regular, starts_with


def test_open_regular_refuses_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        open_regular(fifo)
    with pytest.raises(IsADirectoryError):
        open_regular(tmp_path)
    target = tmp_path / "file"
    target.write_bytes(b"x")
    (tmp_path / "link").symlink_to(target)
    fd, st = open_regular(tmp_path / "link")  # a bundle may be reached through a link
    os.close(fd)
    with pytest.raises(OSError):
        open_regular(tmp_path / "link", owned=True)  # a private entry may not
    target.chmod(0o664)
    with pytest.raises(PermissionError):
        open_regular(target, owned=True)


def test_read_regular_reads_no_more_than_its_limit(tmp_path):
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: its apparent size is never read
    assert len(read_regular(big, limit=100)) == 101  # one past the limit: the caller tells it is over
    (tmp_path / "small").write_bytes(b"abc")
    assert read_regular(tmp_path / "small", limit=100) == b"abc" == read_regular(tmp_path / "small")
    assert starts_with(tmp_path / "small", b"ab") and not starts_with(tmp_path / "small", b"abcd")
    with pytest.raises(OSError, match="not a regular file"):
        read_regular("/dev/zero", limit=10)
