"""Writing a file whole or not at all, with its final mode from the first byte.

The bytes go to a fresh temporary file in the destination folder, created with a random name and
``O_EXCL | O_NOFOLLOW`` (so nothing planted there, a symbolic link to another file say, is ever
opened or written through) and with the file's final mode (a private key is never readable by
others, not even for a moment); ``os.replace`` then publishes it atomically.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def create_beside(path: str | os.PathLike, mode: int, attempts: int = 16) -> tuple[int, Path]:
    """A new file (descriptor, path) in ``path``'s folder with ``mode`` (less the umask) from its creation."""
    path = Path(path)
    for _ in range(attempts):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, _FLAGS, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


@contextmanager
def atomic_write(path: str | os.PathLike, mode: int = 0o666) -> Iterator[BinaryIO]:
    """``with atomic_write(p, 0o600) as f: f.write(...)``: ``p`` holds all of it afterwards, or is untouched."""
    fd, tmp = create_beside(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
