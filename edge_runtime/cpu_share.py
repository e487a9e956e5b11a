"""Whether this process's threads had the CPUs to themselves: what the whole-model check must know
before it trusts a timing that says the workers do not pay.

Linux counts, per thread, the time it was runnable but waited for a CPU (the second field of
``/proc/<pid>/task/<tid>/schedstat``). With another process on the second core of a 2-core Zen 4
this process's threads waited 65-100% of a threaded run's wall time, on free cores 0-4% (the
worker's wake-ups), so the figure tells a busy machine from a quiet one where the one-minute load
average (which lags by tens of seconds) cannot. Also what runs now, for decisions that cannot time
anything first. No llvmlite here: a warm start imports this.
"""

from __future__ import annotations

import os
import threading

_TASKS = "/proc/self/task"


def waited_s() -> float | None:
    """Seconds this process's threads have waited on a run queue so far, all threads together (a
    thread that exited no longer counts: take differences over a stretch with the same threads);
    None where the kernel does not say (no schedstat). The calling thread counts, and every thread
    Python did not start (a session's workers); Python's other threads do not: one that wakes now and
    then while the caller and its workers hold every core waits because of them, not because another
    process took a core (a benchmark's watcher thread, polling every 20 ms, made every round of
    MobileNetV3's check at 2 threads read busy on the 2-core Zen 4, and the compile kept it whole)."""
    total = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    me = threading.current_thread()
    others = {str(t.native_id) for t in threading.enumerate() if t is not me}
    for tid in tids:
        if tid in others:
            continue
        try:
            with open(f"{_TASKS}/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def runnable_now() -> float:
    """Threads running or waiting for a core at this instant, system-wide, this one included (the
    4th field of Linux's /proc/loadavg); the 1-minute load average where that file is missing. What
    decides whether a core is idle for work of milliseconds is now, not the last minute (a
    benchmark's own process kept the average at 1-1.3 on an otherwise idle 2-core host)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return float(int(f.read(128).split()[3].split(b"/")[0]))
    except (OSError, IndexError, ValueError):
        pass
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def own_running() -> int:
    """This process's threads running or runnable now (state R in /proc/self/task/*/stat)."""
    n = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/stat", "rb") as f:
                n += f.read(512).rsplit(b")", 1)[1].split()[0] == b"R"
        except (OSError, IndexError):
            continue
    return n


def room_for(threads: int, others: float | None = None, cpus: int | None = None) -> bool:
    """True when what other processes run now (``others``, default :func:`runnable_now` less
    :func:`own_running`: a warm start's own weight check is no other work) leaves ``threads`` CPUs
    free. One instant's reading, cheap: read on a warm start to decide whether a split decision
    taken on a busy machine is worth taking again; the check itself then measures (:func:`waited_s`)."""
    others = max(0.0, runnable_now() - own_running()) if others is None else others
    return others + threads <= (cores() if cpus is None else cpus)
