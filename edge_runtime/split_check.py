"""The whole-model check: a compile that splits layers keeps the split only if the model runs faster with it.

Each layer's split is predicted from its size and the measured handoff (:mod:`.pool_probe`), and a
part is timed alone (:mod:`.autotune`): neither sees what the parts of a whole model cost together
(handoffs back to back, nudges, caches the other core left cold). So once the model is built, the
compile times it with its workers and without them (every part then runs on the caller, which
costs what the unsplit model costs plus about 1%), in ``ROUNDS`` interleaved rounds, and keeps the
split only when the threaded run's best round median beats the serial one's by ``MARGIN``. Else the
model is built again split at the cheapest handoff (:func:`generous`) and checked the same way, and
failing that with every layer whole, and at N threads it runs exactly the 1-thread code
with no workers: a small model never gets slower for having threads (measured on a 2-core Zen 4:
the small CNN with one layer split ran 0.89x its 1-thread speed). The outcome is cached with the
artifact, keyed by the exact CPU, so the decision is made once per CPU.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import numpy as np

from ..compiler.errors import InterpreterError, RunTimeCheckError
from ..compiler.target import Target
from . import pool_probe
from .session import Session

MARGIN = 0.15  # the workers must save at least this fraction of the serial time (see split_pays)
ROUNDS = 5  # interleaved rounds, each workers on then off
ROUND_S = 0.02  # timed runs per round and side: about this long, at least MIN_RUNS
MIN_RUNS = 5
UNSPLIT_RATIO = 1e12  # ``parallel_sync_ratio`` that no layer's work is worth: every layer stays whole


def random_inputs(session: Session, seed: int = 0) -> dict[str, np.ndarray]:
    """Finite inputs of the session's shapes (float: normal; integer: zeros, valid as any index)."""
    rng = np.random.default_rng(seed)
    return {s.name: (rng.standard_normal(s.shape) if s.dtype.numpy.kind == "f" else np.zeros(s.shape)).astype(s.dtype.numpy)
            for s in session.lowered.inputs}


def timed_rounds(session: Session, rounds: int = ROUNDS, round_s: float = ROUND_S,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(threaded, serial) seconds per run: the least of the rounds' medians, each side. Every run
    copies its inputs in (``run``, not ``run_raw``): a run on the arena's leftovers would read indices
    that later tensors overwrote, and time a Gather's fault instead of the model."""
    inputs = random_inputs(session)
    session.run(inputs)
    t = clock()
    session.run(inputs)
    reps = max(MIN_RUNS, int(round_s / max(clock() - t, 1e-7)))
    medians: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for on in (True, False):
            session.set_workers(on)
            session.run(inputs)  # the first run after a start wakes the workers
            ts = []
            for _ in range(reps):
                t = clock()
                session.run(inputs)
                ts.append(clock() - t)
            medians[on].append(statistics.median(ts))
    session.set_workers(True)
    return min(medians[True]), min(medians[False])


def split_pays(session: Session, margin: float = MARGIN) -> bool:
    """True when the session's workers make it ``margin`` faster than its parts run on one thread;
    also when the model refuses the check's inputs (a runtime check): then nothing is measured and
    the cost model's split stays."""
    try:
        threaded, serial = timed_rounds(session)
    except (InterpreterError, RunTimeCheckError):
        return True
    return threaded < (1 - margin) * serial


def unsplit(target: Target) -> Target:
    """``target`` (as tuned) with every layer whole."""
    return dataclasses.replace(target, conv_parts=(),
                               tuning=target.tuning.replace(parallel_sync_ratio=UNSPLIT_RATIO))


def generous(target: Target) -> Target:
    """``target`` split by the cost model at the cheapest handoff there is: the probe reads one of two
    figures, a worker that claims its part at once (1 us) or one that claims it after the caller ran
    its own (the part's length); on a quiet 2-core Zen 4 it read the second in 4 of 5 fresh compiles,
    and MobileNetV2 then split 3 layers and lost, where the 49 layers split at 1 us ran 1.42x its
    1-thread speed."""
    return dataclasses.replace(target, conv_parts=(),
                               tuning=target.tuning.replace(parallel_sync_us=pool_probe.FLOOR_US))


def fallbacks(target: Target) -> tuple[Target, ...]:
    """The plans a compile tries, in turn, after its tuned split was measured not to pay: the split at
    the cheapest handoff (unless that was the plan), then every layer whole. Each is built and checked
    like the first; a plan that splits nothing ends the search."""
    cheaper = (generous(target),) if target.tuning.parallel_sync_us > pool_probe.FLOOR_US else ()
    return cheaper + (unsplit(target),)
