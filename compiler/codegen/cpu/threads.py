"""Which thread counts generated code may have: checked before lowering and on a warm start, which
must not import the code generator (``workers`` builds IR with llvmlite)."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import CompileError
from ...target import Target

MAX_THREADS = 64
FUTEX_SYSCALL: Mapping[str, int] = {"x86_64": 202, "aarch64": 98}
"""Linux ``SYS_futex`` by architecture (the triple's first part)."""
AFFINITY_SYSCALLS: Mapping[str, tuple[int, int]] = {"x86_64": (204, 203), "aarch64": (123, 122)}
"""Linux ``SYS_sched_getaffinity`` and ``SYS_sched_setaffinity`` by architecture."""


def check_threads(target: Target) -> None:
    """Refuse a thread count this target's code cannot have (typed, before any lowering)."""
    n = target.threads
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_THREADS:
        raise CompileError(f"threads must be an integer from 1 to {MAX_THREADS}, got {n!r}")
    if n > 1 and target.triple.split("-")[0] not in FUTEX_SYSCALL:
        raise CompileError(f"multi-threaded code is not available for {target.triple!r}; use threads=1")
