"""A split session times itself now and then with its workers and without them, on the user's own
runs, and keeps the faster way.

Why: the compile-time check (:mod:`.split_check`) decides once, but what a split saves depends on
where the host runs the cores, and that can change under a running process. On the 2-CPU Zen 4 build
host (a KVM guest) the two virtual CPUs share a last-level cache most of the time and, for stretches
of seconds, do not: a split MobileNetV2 then ran 1.22x its 1-thread code's time instead of 0.61x
(``benchmarks/thread_placement.py``). Every ``Tuning.worker_watch_s`` seconds the next runs are timed
with the workers on, then off (``Tuning.worker_watch_runs`` each, after one that lets the change
settle), and the faster median is kept; the way the session runs now is left only for one faster by
``MARGIN``. Both ways compute the same bits (a split layer's parts run the same code on any thread),
so only the speed changes. The cost is the timed runs in the slower way, a few in thousands, and a
thread start or join when the choice changes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

MARGIN = 0.05  # leave the current way only for one this much faster (medians): no flapping on noise


@dataclass
class WorkerWatch:
    interval_s: float
    runs: int
    set_workers: Callable[[bool], None]
    now: float  # when the watch starts: the first trial comes one interval later
    workers: bool = True  # the way chosen: how the session runs between trials
    _due: float = field(init=False)
    _running: bool = field(init=False)  # how it runs at this moment (a trial's way during one)
    _trial: bool | None = field(init=False, default=None)  # the way being timed; None between trials
    _times: dict[bool, list[float]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._due, self._running = self.now + self.interval_s, self.workers

    def observe(self, seconds: float, now: float) -> None:
        """One run took ``seconds``, ending at ``now`` (the session's clock)."""
        if self._trial is None:
            if now >= self._due:
                self._times = {True: [], False: []}
                self._start_trial(True)
            return
        self._times[self._trial].append(seconds)
        if len(self._times[self._trial]) <= self.runs:  # the first run of each way only settles it
            return
        if self._trial:
            self._start_trial(False)
            return
        on, off = (statistics.median(self._times[way][1:]) for way in (True, False))
        self.workers = not off < on * (1 - MARGIN) if self.workers else on < off * (1 - MARGIN)
        self._trial, self._due = None, now + self.interval_s
        self._run_as(self.workers)

    def _start_trial(self, workers: bool) -> None:
        self._trial = workers
        self._run_as(workers)

    def _run_as(self, workers: bool) -> None:
        if workers != self._running:
            self.set_workers(workers)
            self._running = workers
