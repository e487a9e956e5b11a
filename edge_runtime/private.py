"""A device's private files: 0700 directories, a 0600 secret made atomically, files opened without trust.

The file system is as hostile as any other input: a path may name a directory, a FIFO (whose
``open`` blocks until a writer comes), a symbolic link planted by someone else, or a file another
user can write. Every open here is non-blocking and checks what it got with ``fstat`` on the open
descriptor (never the path again, which could have changed in between).

This module is the one place that reads ``XDG_STATE_HOME`` (default ``~/.local/state``).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..compiler.errors import CuvilError

SECRET_BYTES = 32
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class SecretError(CuvilError):
    """The device secret's file exists but is not a private, well-formed secret of this user."""


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/cuvil``: the device's own secrets."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "cuvil"


def private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` and every missing parent with mode 0700 (existing directories are left as they are)."""
    path = Path(path)
    missing = []
    for p in (path, *path.parents):
        if p.is_dir():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            if not p.is_dir():
                raise
    return path


def open_regular(path: str | os.PathLike, *, owned: bool = False) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only without blocking; refuse anything but a regular file.

    ``owned``: also refuse a symbolic link and a file that is not this user's or that group or
    others may write (what a private cache entry must be). Raises OSError, never blocks on a FIFO.
    """
    fd = os.open(path, _OPEN_FLAGS | (os.O_NOFOLLOW if owned else 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if owned and (st.st_uid != os.geteuid() or st.st_mode & 0o022):
            raise PermissionError(errno.EPERM, "not owned by this user alone", str(path))
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def read_exactly(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd`` into private memory (fewer where the file ends early); one copy."""
    parts, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_at(fd: int, start: int, length: int) -> memoryview:
    """``length`` bytes of ``fd`` from ``start`` into a private buffer of their own (fewer where the file
    ends early); one copy, and the file position is left as it was."""
    view, got = memoryview(bytearray(length)), 0
    while got < length:
        n = os.preadv(fd, [view[got:]], start + got)
        if n == 0:
            break
        got += n
    return view[:got]


def read_regular(path: str | os.PathLike) -> bytes:
    """The whole regular file at ``path`` in private memory (fewer bytes where it shrank meanwhile);
    OSError for anything else, never blocking on a FIFO."""
    fd, st = open_regular(path)
    try:
        return read_exactly(fd, st.st_size)
    finally:
        os.close(fd)


def device_secret(path: str | os.PathLike | None = None) -> bytes:
    """The device's secret (32 random bytes), created on first use; default ``state_dir()/device.key``.

    Created atomically with mode 0600 from the first byte: written to a fresh ``O_EXCL`` temporary
    file in the same folder, then hard-linked to its name (a link never replaces an existing file, so
    of two processes creating it at once, both read the one that won).
    """
    path = Path(path) if path is not None else state_dir() / "device.key"
    try:
        return _read_secret(path)
    except FileNotFoundError:
        _create_secret(path)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    try:
        fd, st = open_regular(path, owned=True)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise SecretError(f"device secret {path}: {e.strerror or e}") from None
    try:
        if st.st_mode & 0o077 or st.st_size != SECRET_BYTES:
            raise SecretError(f"device secret {path} must be {SECRET_BYTES} bytes with mode 0600")
        data = read_exactly(fd, SECRET_BYTES)
    finally:
        os.close(fd)
    if len(data) != SECRET_BYTES:
        raise SecretError(f"device secret {path} is truncated")
    return data


def _create_secret(path: Path) -> None:
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # O_EXCL, 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: theirs is read
    finally:
        os.unlink(tmp)
