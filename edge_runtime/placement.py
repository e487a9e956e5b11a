"""The calling thread steps off its workers' CPUs before each run.

Each worker binds itself to one CPU: worker *i* to the *i*-th of the affinity mask it inherited, the
first left to the caller, which stays unbound (it is the user's thread). The scheduler may still run
the caller on a worker's CPU: a thread that slept wakes where it last ran, and that CPU was idle
while its worker slept. Caller and worker then share one CPU while another idles. On the 2-core
Zen 4 (2026-12-04), with a 20 ms pause before each block of 20 runs (a device between requests, a
benchmark between runtimes), ResNet-18 at 2 threads ran 2.9 ms with the caller on CPU 0 and 7.1 ms
on the worker's CPU 1 (5.3 ms at 1 thread), the sweep's 1-D audio CNN 362 against 472 us (417 at 1
thread). So before a run the caller reads its CPU (``sched_getcpu``: no system call on x86-64 and
AArch64 Linux) and, on a worker's, narrows its own affinity to the other CPUs, which moves it at
once, then gives the mask back as it was: the user's thread keeps its mask, and the scheduler has no
reason to move a running thread back onto a busy CPU.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable


def _sched_getcpu() -> Callable[[], int] | None:
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn


class CallerPlacement:
    """Where a session's pinned workers run, taken from the mask of the thread that starts them (as the
    workers take theirs); :meth:`step_aside` moves the calling thread off those CPUs. A no-op at one
    thread (or ``CallerPlacement(1)`` for workers that are not pinned), where the platform has no
    affinity calls or no ``sched_getcpu``, or where no worker has a CPU of its own."""

    def __init__(self, threads: int, getcpu: Callable[[], int] | None = None) -> None:
        get_mask = getattr(os, "sched_getaffinity", None)
        cpus = sorted(get_mask(0)) if threads > 1 and get_mask and hasattr(os, "sched_setaffinity") else []
        self.workers = frozenset(cpus[1:threads])
        self.others = frozenset(cpus) - self.workers
        self._getcpu = (getcpu or _sched_getcpu()) if self.workers and self.others else None

    def step_aside(self) -> bool:
        """Move the calling thread off the workers' CPUs if it runs on one; whether it moved."""
        if self._getcpu is None or self._getcpu() not in self.workers:
            return False
        try:
            mask = os.sched_getaffinity(0)
            if not mask & self.others:
                return False  # this thread may only run where the workers do
            os.sched_setaffinity(0, mask & self.others)
            os.sched_setaffinity(0, mask)
        except OSError:
            return False
        return True
