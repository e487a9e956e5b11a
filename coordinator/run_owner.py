"""Who owns a run in the results store, and whether that owner is gone (so the run may be taken over
or marked aborted): a process on some host, alive or not, writing its heartbeat or silent."""

from __future__ import annotations

import os
import socket
from pathlib import Path

STALE_AFTER_S = 60.0  # a running run whose owner has not written for this long is gone


def this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_gone(owner: str, heartbeat_at: float | None, now: float, stale_after: float = STALE_AFTER_S) -> bool:
    """A run's owner is gone if it is a dead process on this host, or silent for ``stale_after`` seconds."""
    host, _, pid = owner.rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
        return True
    return heartbeat_at is None or now - heartbeat_at > stale_after


def _alive(pid: int) -> bool:
    """A process exists and is not a zombie (a killed ServerApp stays a zombie until its parent reaps it)."""
    if Path("/proc/self/stat").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2] not in "ZX"
    try:  # no /proc here: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
