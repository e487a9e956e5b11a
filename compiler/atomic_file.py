"""Writing a file whole or not at all, with its final mode from the first byte.

The bytes go to a fresh temporary file in the destination folder, created with a random name and
``O_EXCL | O_NOFOLLOW`` (so nothing planted there, a symbolic link to another file say, is ever
opened or written through) and with the file's final mode (a private key is never readable by
others, not even for a moment); ``os.replace`` then publishes it atomically. Only a regular file, a
link or nothing is ever replaced: ``-o /dev/null`` as root swapped the system's null device for a file.
Files that belong together (a key pair, a certificate set) are written by :func:`write_all`: all
staged, then all published, so a failure while writing leaves every one of them as it was.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _token() -> str:
    """A random part of a temporary name (``secrets`` would import ``hmac``: see :mod:`.digest`)."""
    return os.urandom(8).hex()


def create_beside(path: str | os.PathLike, mode: int, attempts: int = 16) -> tuple[int, Path]:
    """A new file (descriptor, path) in ``path``'s folder with ``mode`` (less the umask) from its creation."""
    path = Path(path)
    for _ in range(attempts):
        tmp = path.with_name(f".{path.name}.{_token()}.tmp")
        try:
            return os.open(tmp, _FLAGS, mode), tmp
        except FileExistsError:
            continue
        except FileNotFoundError:  # named by the file asked for, not the temporary one
            raise FileNotFoundError(errno.ENOENT, "no such folder for", str(path)) from None
    raise FileExistsError(f"no free temporary name beside {path}")


def check_replaceable(path: str | os.PathLike) -> None:
    """FileExistsError unless ``path`` is absent, a regular file or a symbolic link (the link itself is
    replaced, never written through): a device, FIFO, socket or folder would be swapped for the file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise FileExistsError(errno.EEXIST, "exists and is not a regular file; refusing to replace it", str(path))


@contextmanager
def atomic_write(path: str | os.PathLike, mode: int = 0o666) -> Iterator[BinaryIO]:
    """``with atomic_write(p, 0o600) as f: f.write(...)``: ``p`` holds all of it afterwards, or is untouched."""
    check_replaceable(path)
    fd, tmp = create_beside(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        _publish([(tmp, path)])
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_all(files: Sequence[tuple[str | os.PathLike, bytes, int]]) -> None:
    """Each ``(path, data, mode)`` written whole: every file staged and every target checked first, then
    all published; a failure before that leaves every target as it was (``keygen --force`` had replaced
    the private key when writing the public one failed)."""
    staged: list[tuple[Path, str | os.PathLike]] = []
    try:
        for path, data, mode in files:
            check_replaceable(path)
            fd, tmp = create_beside(path, mode)
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        _publish(staged)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise


def _publish(staged: Sequence[tuple[Path, str | os.PathLike]]) -> None:
    """Each written temporary over its target, every target checked again first (one may have been
    replaced by something else while the data was written)."""
    for _, path in staged:
        check_replaceable(path)
    for tmp, path in staged:
        os.replace(tmp, path)
