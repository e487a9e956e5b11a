"""How the results store meets SQLite: how long a write waits for another process's lock, and how a
viewer opens a database it must not change, on read-only storage too.

Another process may hold the write lock for a while (a backup, an operator's ``sqlite3`` session). A
write waits for it as long as a run's owner may be silent before it counts as gone
(:data:`WRITE_WAIT_S`), then fails (StoreError: the run is given up, its replies kept); a heartbeat,
a liveness hint written again a beat later, waits no longer than one try (:data:`LOCK_TRY_S`).

A viewer opens with ``mode=ro``. A WAL database needs its ``-wal`` and ``-shm`` files beside it, which
a read-only connection makes and cannot remove: :func:`tidy` removes them where it made them and no
other connection uses them. Where the directory cannot be written and they are absent, nothing can
write the database, so it is opened ``immutable`` (no lock, no side file).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from .run_owner import STALE_AFTER_S

LOCK_TRY_S = 1.0  # SQLite's own wait for a lock, per try (the connection's busy timeout)
WRITE_WAIT_S = STALE_AFTER_S  # a write waits this long for another process's lock, in all
SIDE_FILES = ("-wal", "-shm")


def locked(e: sqlite3.Error) -> bool:
    """Whether ``e`` is another connection's lock (SQLITE_BUSY or SQLITE_LOCKED, extended codes too)."""
    return getattr(e, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def begin_write(db: sqlite3.Connection, wait_s: float) -> None:
    """BEGIN IMMEDIATE: take the write lock before the transaction's first statement, trying again while
    another connection holds it, for ``wait_s`` seconds in all (its sqlite3.OperationalError after)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            db.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as e:
            if not locked(e) or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)  # a try that failed at once (a busy timeout of 0) must not spin


def connect_read_only(path: Path, timeout: float) -> tuple[sqlite3.Connection, bool]:
    """A connection that cannot write to the database at ``path``; and whether it makes the side files
    (then :func:`tidy` after closing it)."""
    absent = not any(_side(path, s).exists() for s in SIDE_FILES)
    immutable = absent and not os.access(path.parent, os.W_OK)
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")
    db = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None, check_same_thread=False)
    return db, absent and not immutable


def tidy(path: Path) -> None:
    """Remove the side files a closed read-only connection made: a plain connection reads and closes, and
    SQLite removes them as the last connection does (where another still has the database open, they
    stay: it needs them). Best effort: a file that cannot be written keeps them."""
    try:
        db = sqlite3.connect(path, timeout=0)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        pass


def _side(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)
