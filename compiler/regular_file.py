"""Reading a file named by someone else: a regular file or an error, never a block, never unbounded.

A path given to Cuvil may name a directory, a FIFO (whose ``open`` blocks until a writer comes), a
device such as ``/dev/zero`` (endless), a symbolic link planted by another user, or a file another
user can write. Every open here is non-blocking and checks what it got with ``fstat`` on the open
descriptor (never the path again, which could have changed in between); every read is bounded by
the size the caller expects or the file's own size. The lowest layer, so that key files and source
models (compiler) as well as bundles and cache entries (edge runtime) are opened the same way.
"""

from __future__ import annotations

import errno
import os
import stat

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def owned_alone(st: os.stat_result) -> bool:
    """Whether ``st`` is this user's and neither group nor others may write it: the one rule for a private
    file (:func:`open_regular` with ``owned``, the compile cache's eviction, the tuning record's lock)."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


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
        if owned and not owned_alone(st):
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


def read_regular(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The regular file at ``path`` in private memory (fewer bytes where it shrank meanwhile); OSError
    for anything else, never blocking on a FIFO. ``limit``: at most ``limit + 1`` bytes are read, so
    a caller tells a file over its limit by the length, whatever size the file claims or grows to."""
    fd, st = open_regular(path)
    try:
        return read_exactly(fd, st.st_size if limit is None else min(st.st_size, limit) + 1)
    finally:
        os.close(fd)


def starts_with(path: str | os.PathLike, prefix: bytes) -> bool:
    """Whether the regular file at ``path`` begins with ``prefix`` (OSError as :func:`open_regular`)."""
    fd, _ = open_regular(path)
    try:
        return read_exactly(fd, len(prefix)) == prefix
    finally:
        os.close(fd)
