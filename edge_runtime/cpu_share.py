"""Whether this process's threads had the CPUs to themselves: what the whole-model check must know
before it trusts a timing that says the workers do not pay.

Linux counts, per thread, the time it was runnable but waited for a CPU (the second field of
``/proc/<pid>/task/<tid>/schedstat``). With another process on the second core of a 2-core Zen 4
this process's threads waited 65-100% of a threaded run's wall time, on free cores 0-4% (the
worker's wake-ups), so the figure tells a busy machine from a quiet one where the one-minute load
average (which lags by tens of seconds) cannot. No llvmlite here: a warm start imports this.
"""

from __future__ import annotations

import os

_TASKS = "/proc/self/task"


def waited_s() -> float | None:
    """Seconds this process's threads have waited on a run queue so far, all threads together (a
    thread that exited no longer counts: take differences over a stretch with the same threads);
    None where the kernel does not say (no schedstat)."""
    total = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def cores() -> int:
    """The CPUs this process may run on (its affinity mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def room_for(threads: int, load: float | None = None, cpus: int | None = None) -> bool:
    """True when the last minute's load left ``threads`` CPUs free for this process (load average
    below ``cpus - threads + 1``: this process itself counts as one while it runs). A lagging,
    cheap hint, read on a warm start to decide whether a split decision taken on a busy machine
    is worth taking again now; the check itself then measures (:func:`waited_s`)."""
    load = os.getloadavg()[0] if load is None else load
    return load < (cores() if cpus is None else cpus) - threads + 1
