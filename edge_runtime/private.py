"""A device's private files: 0700 directories, a 0600 secret made atomically.

The file system is as hostile as any other input: the secret is opened as every file a device did
not just write is (:mod:`cuvil.compiler.regular_file`: non-blocking, checked with ``fstat`` on the
open descriptor, owned by this user alone).

This module is the one place that reads ``XDG_STATE_HOME`` (default ``~/.local/state``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..compiler.errors import CuvilError
from ..compiler.regular_file import open_regular, read_exactly

SECRET_BYTES = 32


class SecretError(CuvilError):
    """The device secret's file exists but is not a private, well-formed secret of this user."""


def xdg_dir(variable: str, default: str, environ: Mapping[str, str] | None = None) -> Path:
    """``$variable/cuvil``, else ``~/<default>/cuvil``: a relative value is ignored, as the XDG Base Directory
    spec says (it named a folder in each working directory)."""
    base = (os.environ if environ is None else environ).get(variable, "")
    return Path(base if os.path.isabs(base) else os.path.join(os.path.expanduser("~"), default)) / "cuvil"


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/cuvil``: the device's own secrets."""
    return xdg_dir("XDG_STATE_HOME", os.path.join(".local", "state"), environ)


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
