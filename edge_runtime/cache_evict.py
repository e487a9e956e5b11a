"""The compile cache's size limit: which files count, which go first, and what killed writes leave behind.

Only what the cache would load counts: a regular file of this user that neither group nor others
may write (:func:`cuvil.compiler.regular_file.owned_alone`, the rule every read of an entry applies), sized by the
blocks it occupies. So a file another user plants in a shared cache directory, or a sparse file of
huge apparent size, neither spends the budget nor makes the device delete its own entries.

A write goes to a temporary file (``.*.tmp``: :meth:`.sealed.Sealer.write`, the cache's hints) that
is removed only on an exception; a write killed outright (SIGKILL, the OOM killer, power loss)
leaves it behind. One of this user's unchanged for :data:`DEBRIS_AFTER_S` is such debris and is
deleted; a younger one may be a write under way, so it stays and counts toward the limit.

A hint (``*.cuvil-hint``: the key that served a request last, 64 bytes) whose entry is gone guides
nothing any more and goes too: one is written per distinct request, so they would pile up forever.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

from ..compiler.bundle.format import is_sha256_hex
from ..compiler.regular_file import open_regular, owned_alone

log = logging.getLogger(__name__)

DEBRIS_AFTER_S = 3600.0
"""A temporary file of this user unchanged this long is a killed write's: no live write lasts an hour."""
_BLOCK = 512  # the unit of st_blocks, whatever the file system's block size


def allocated(st: os.stat_result) -> int:
    """The bytes a file occupies: its blocks, at most its size (a sparse file claims only what it holds)."""
    return min(st.st_size, st.st_blocks * _BLOCK)


def _temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def _stale_hint(hint: Path, directory: Path, suffix: str) -> bool:
    """Whether ``hint`` (this user's alone) names an entry that is not in ``directory``."""
    try:
        fd, _ = open_regular(hint, owned=True)
        try:
            key = os.read(fd, 65).decode("ascii")
        finally:
            os.close(fd)
    except (OSError, UnicodeDecodeError):
        return False  # another user's, or unreadable: left alone
    return not is_sha256_hex(key) or not (directory / f"{key}{suffix}").exists()


def evict(directory: Path, suffix: str, max_bytes: int, keep: Path | None = None,
          hint_suffix: str | None = None) -> list[Path]:
    """Delete this user's temporary files older than DEBRIS_AFTER_S, then the least recently used entries
    (``*suffix``, by the later of last read and last write) until they and the younger temporary files
    fit in ``max_bytes``, never ``keep``; then the hints (``*hint_suffix``) whose entry is gone. Returns
    the deleted paths."""
    entries, debris, hints, total, skipped, now = [], [], [], 0, 0, time.time()
    try:
        with os.scandir(directory) as it:
            for e in it:
                temporary = _temporary(e.name)
                if hint_suffix and e.name.endswith(hint_suffix):
                    hints.append(Path(e.path))
                if not (temporary or e.name.endswith(suffix)):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not (stat.S_ISREG(st.st_mode) and owned_alone(st)):
                    skipped += 1
                elif temporary and now - st.st_mtime > DEBRIS_AFTER_S:
                    debris.append(Path(e.path))
                else:
                    total += allocated(st)
                    if not temporary:
                        entries.append((max(st.st_atime, st.st_mtime), allocated(st), Path(e.path)))
    except OSError:
        return []
    gone = [p for p in debris if _unlink(p)]
    collected = len(gone)
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        if path != keep and _unlink(path):
            total -= size
            gone.append(path)
    gone += [h for h in hints if _stale_hint(h, directory, suffix) and _unlink(h)]
    if skipped:
        log.debug("compile cache %s: %d files not this user's alone neither counted nor deleted", directory, skipped)
    if gone:
        log.info("compile cache %s: %d least recently used entries and %d temporary files of killed writes "
                 "deleted to keep it within %d bytes", directory, len(gone) - collected, collected, max_bytes)
    return gone
