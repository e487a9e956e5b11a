"""Where the compile cache lives and how much it keeps, as the environment says, each setting checked:
``$XDG_CACHE_HOME/cuvil`` (a relative value ignored, as the XDG spec says), at most
``CUVIL_CACHE_MAX_BYTES`` of entries (default 2 GiB)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..compiler.errors import CuvilError
from .private import xdg_dir


def default_dir() -> Path:
    return xdg_dir("XDG_CACHE_HOME", ".cache")


DEFAULT_MAX_BYTES = 2 << 30
MAX_BYTES_ENV = "CUVIL_CACHE_MAX_BYTES"


def default_max_bytes() -> int:
    """The entries' total size a cache keeps (``CUVIL_CACHE_MAX_BYTES``, default 2 GiB): every model
    version and every Cuvil upgrade writes new entries, and a development host had gathered 6 GB."""
    given = os.environ.get(MAX_BYTES_ENV)
    if given is None:
        return DEFAULT_MAX_BYTES
    if not (given.strip().isascii() and given.strip().isdigit()):  # -1 was 0 (keep nothing), a typo the default
        raise CuvilError(f"{MAX_BYTES_ENV}={given[:40]!r} is not a number of bytes (0 or more)")
    return int(given)


def unusable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be a cache directory (a file is there, or above it), or None."""
    try:
        return None if stat.S_ISDIR(os.stat(path).st_mode) else f"{path} is not a directory"
    except FileNotFoundError:
        return None  # made on the first write
    except OSError as e:
        return f"{path}: {e.strerror or e}"
