"""The whole-model check: a compile that splits layers keeps the split only if the model runs faster with it.

Each layer's split is predicted from its size and the measured handoff (:mod:`.pool_probe`), and a
part is timed alone (:mod:`.autotune`): neither sees what the parts of a whole model cost together
(handoffs back to back, nudges, caches the other core left cold). So once the model is built, the
compile times it with its workers and without them (every part then runs on the caller, which
costs what the unsplit model costs plus about 1%), in interleaved rounds, and keeps the split when
the threaded run's fastest beats the serial one's by a margin and its median run the serial median
by as much: ``MARGIN`` (15%) of a small model's run, what a wake-up and a few handoffs may cost
(``WAKE_S``) of a longer one's, and at least ``MIN_MARGIN`` (:func:`margin_for`). Else the model is built again split at the cheapest handoff (:func:`generous`) and
checked the same way, and failing that with every layer whole, and at N threads it runs exactly the
1-thread code with no workers: a small model never gets slower for having threads (measured on a
2-core Zen 4: the small CNN with one layer split ran 0.89x its 1-thread speed). A longer run whose
"whole" is unsettled keeps the split build instead, its workers off (:func:`keeps_built`). A split that saves
under ``IDLE_BELOW_S`` a run back to back is also timed after idle gaps (:func:`after_idle`), as a
device that runs the model now and then sees it: its workers sleep by then, and one that loses there
is kept whole too. A tuned split that pays though it was made at a handoff dearer than the cheapest,
where the cheapest would split the model otherwise, is built at the cheapest too and checked the same
way, and the better of the two is kept (:func:`cheaper_wins`).

A verdict of "whole" is trusted only from rounds in which the workers had free cores
(:mod:`.cpu_share`): with another process on the second core of that Zen 4 every threaded run
stalls on a preempted worker, and even the fastest of 25 ran 7-14% slower than the serial one, so
the check flipped and the cached verdict kept ResNet-18 whole on quiet cores (3 of 4 compiles
while other work ran). The rounds go on until ``CLEAN_ROUNDS`` of them had free cores
(``EARLY_ROUNDS`` for a split that saves twice the margin) or ``MAX_ROUNDS`` ran; a "whole" without
enough clean rounds is *unsettled*: the compile keeps the model whole (what runs faster now) but the
cache entry says so, and a warm start a minute or more
later with room on the cores compiles and checks again (:func:`recheck`; a kept split build is checked
as it loads, nothing compiled). A "whole" on free cores is
settled by a second such check only (one check read "whole" for a MobileNetV2 that four others split).
The outcome is cached with the artifact, keyed by the exact CPU; a settled one also goes to the CPU's
tuning record under the model's structure (:mod:`.tuning_record`), so the model's next versions build
the settled plan without a check.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..compiler.errors import InterpreterError, RunTimeCheckError
from ..compiler.spread import spread
from ..compiler.target import Target
from . import cpu_share
from .session import Session

MARGIN = 0.15  # the workers must save at least this fraction of the serial time (see decide), on small models
MIN_MARGIN = 0.05  # and of a long run at least this much (see margin_for)
WAKE_S = 50e-6  # what waking the workers and a few handoffs may cost a run (after_idle: 25-40 us on Zen 4)
CLEAN_ROUNDS = 3  # rounds with free cores that settle a verdict
EARLY_ROUNDS = 1  # rounds with free cores that settle a split saving twice its margin (see clearly_split)
MAX_ROUNDS = 8  # interleaved rounds at most, each workers on then off
BUSY_SHARE = 0.10  # threads waiting for a CPU longer than this share of a round: no free cores (0-4% on free ones)
ROUND_S = 0.02  # timed runs per round and side: about this long, at least MIN_RUNS
MIN_RUNS = 5
WARM_RUNS = 2  # untimed runs before each side's timed ones, at least (ResNet-18: 7-13 ms)
WARM_S = 0.002  # and at least this long: a small model's first runs wake the workers and warm their caches
RECHECK_AFTER_S = 60.0  # an unsettled entry serves as it is for this long (see recheck)
UNSPLIT_RATIO = 1e12  # ``parallel_sync_ratio`` that no layer's work is worth: every layer stays whole
IDLE_BELOW_S = 0.0002  # a split saving less than this per run (median) is timed after idle gaps too (see after_idle)
IDLE_GAP_S = 0.002  # idle before each such run: longer than any worker spins (``Tuning.pool_spin``), so it sleeps
IDLE_RUNS = 7  # runs after idle, per side
GOOD_SHARE = 0.8  # a split whose speedup reaches this share of its thread count is not checked against a cheaper one
KEEP_SPLIT_S = 0.0003  # an unsettled "whole" on a serial run this long keeps its split build, workers off (keeps_built)


@dataclass(frozen=True)
class Round:
    """One interleaved round: each side's fastest run (seconds), the share of the threaded runs'
    wall time this process's threads waited for a CPU (None: the kernel does not say; trusted), and
    each side's median run (None: not timed)."""

    threaded: float
    serial: float
    waited: float | None = 0.0
    threaded_median: float | None = None
    serial_median: float | None = None

    @property
    def clean(self) -> bool:
        return self.waited is None or self.waited <= BUSY_SHARE


@dataclass(frozen=True)
class Verdict:
    """Keep the split or not; ``settled``: a split that paid, or "whole" measured on free cores and
    confirmed by a second check, so a cache entry built on it need not be checked again; ``reason``:
    the figures, for the entry; ``measured``: taken on free cores (a "whole" that is not is no reason
    to try a cheaper split now); ``saving_s``: what a split that pays saves a run back to back (seconds:
    the median serial run less the threaded one, the fastest where no medians were timed); ``speedup``:
    the serial run over the threaded one, taken the same way (a split's, else 0); ``serial_s``: the
    serial run, taken the same way."""

    split: bool
    settled: bool
    reason: str
    measured: bool = True
    saving_s: float = 0.0
    speedup: float = 0.0
    serial_s: float = 0.0  # the serial run timed (median where timed, else fastest): see keeps_built


@dataclass(frozen=True)
class IdleStarts:
    """Each side's median run after ``IDLE_GAP_S`` of idle (seconds): the workers asleep, as on a device
    that runs the model now and then rather than back to back."""

    threaded: float
    serial: float


def decide(rounds: Sequence[Round], margin: float = MARGIN, confirm: bool = False,
           idle: IdleStarts | None = None) -> Verdict:
    """The verdict on ``rounds`` (at least one): the fastest threaded run against the fastest serial
    one, over the rounds with free cores when there are any (other work only adds time, and a round
    without a free core shows the stall of a preempted worker, not the split), over all otherwise.
    The split pays when it saves ``margin``, and, where the rounds timed medians, saves it on the
    median run too: the small CNN's one split layer ran 0.016 against 0.018 ms at its fastest, but
    0.022 against 0.019 at the median and 0.23 against 0.03 at the 99th percentile (a worker's
    handoff is a few microseconds, its layer not many more). "Whole" is settled by ``CLEAN_ROUNDS``
    clean rounds only, and not when the fastest run pays while the threaded runs spread far wider than
    the serial ones (median over fastest, by more than ``margin``): then something else held the
    second core in most runs, which the run-queue delay did not see (ResNet-18 at 2 threads on the
    2-core Zen 4, the first of three compiles in one process: fastest 3.46 against 5.83 ms, medians
    5.69 and 6.11; the next two compiles split, medians 3.39 and 6.57); settled, that verdict kept
    the model whole for good. Even on free cores one check may read "whole" where the split pays
    (MobileNetV2 at 2 threads: fastest 1.20 against 1.31 ms in one compile, where four others split,
    0.73-0.82 against 1.16-1.27 ms), so a first "whole" is settled only when ``confirm`` (this check
    re-takes a whole entry's decision, on a later warm start). ``idle``: the runs after idle gaps
    (:func:`after_idle`); a split whose threaded run is slower there than the serial one is kept whole,
    settled at once when it is slower by ``margin`` (what a worker's wake-up costs does not change from
    one check to the next), else as a first "whole" is (a second check confirms it)."""
    clean = [r for r in rounds if r.clean]
    used = clean or list(rounds)
    threaded, serial = min(r.threaded for r in used), min(r.serial for r in used)
    basis = (f"fastest of {len(used)} rounds{' with free cores' if clean else ''}: threaded {threaded * 1e3:.3f} ms, "
             f"serial {serial * 1e3:.3f} ms")
    medians = _medians(used)
    typical, disturbed = True, False
    fastest_pays = threaded < (1 - margin) * serial
    if medians is not None:
        t_med, s_med = medians
        basis += f"; medians {t_med * 1e3:.3f} and {s_med * 1e3:.3f} ms"
        typical = t_med < (1 - margin) * s_med
        disturbed = fastest_pays and t_med / threaded > (1 + margin) * s_med / serial
    serial_s = medians[1] if medians is not None else serial

    def verdict(split: bool, settled: bool, reason: str, **more) -> Verdict:  # every verdict carries the serial run
        return Verdict(split, settled, reason, serial_s=serial_s, **more)

    if fastest_pays and typical and idle is not None and idle.threaded > idle.serial:
        settled = confirm or idle.threaded > (1 + margin) * idle.serial  # a clear loss is the wake-up's, not noise
        return verdict(False, settled, f"whole{'' if settled else ', unsettled until a later check confirms it'}: "
                                       f"after {IDLE_GAP_S * 1e3:g} ms idle (the workers asleep) the threaded run "
                                       f"took {idle.threaded * 1e3:.3f} ms, the serial one {idle.serial * 1e3:.3f} "
                                       f"(medians of {IDLE_RUNS}); back to back, {basis}")
    if fastest_pays and typical:
        t_run = medians[0] if medians is not None else threaded
        return verdict(True, True, f"split: {basis}" + (f"; after {IDLE_GAP_S * 1e3:g} ms idle {idle.threaded * 1e3:.3f} "
                                                         f"and {idle.serial * 1e3:.3f} ms" if idle else ""),
                       saving_s=serial_s - t_run, speedup=serial_s / t_run)
    if disturbed:
        return verdict(False, False, f"whole, unsettled: the fastest run saves {margin:.0%} or more, the median run "
                                     f"does not and the threaded runs spread wider than the serial ones; {basis}",
                       measured=False)
    if len(clean) >= CLEAN_ROUNDS and confirm:
        return verdict(False, True, f"whole: the workers save less than {margin:.0%} in a second check; {basis}")
    if len(clean) >= CLEAN_ROUNDS:
        return verdict(False, False, f"whole, unsettled until a later check confirms it: the workers save less "
                                     f"than {margin:.0%}; {basis}")
    waits = sorted(r.waited for r in rounds if not r.clean)
    busy = f" (in the others the threads waited {waits[0]:.0%}-{waits[-1]:.0%} of the time)" if waits else ""
    return verdict(False, False, f"whole, unsettled: {len(clean)} of {len(rounds)} rounds had free cores for the "
                                 f"workers{busy}; {basis}", measured=False)


def cheaper_worth_trying(tuned: Verdict, threads: int) -> bool:
    """Whether a tuned split that paid leaves the split at the cheapest handoff enough to gain to be built and
    checked too (a second build and check: MobileNetV2 at 2 threads, cold, 3.7 against 1.7-2.0 s): not when
    its threaded run already takes at most ``1 / (GOOD_SHARE x threads)`` of its serial one."""
    return tuned.split and tuned.speedup < GOOD_SHARE * threads


def cheaper_wins(tuned: Verdict, cheaper: Verdict) -> bool:
    """Whether the split at the cheapest handoff (:func:`generous`) is kept over the tuned split that also
    paid: it paid too, and the tuned one's speedup over its serial run is not ahead of it by
    ``MIN_MARGIN`` (a tie keeps the plan already built). Each plan is checked against its own serial run, in
    its own interleaved rounds, so the ratio of each check, not its milliseconds, is compared: the host's
    speed may have moved between the two. The probe's figure follows where the host put the two cores
    at that moment (a 2-core Zen 4 read 1, 2 or 5 us in six fresh processes a few seconds apart), and the
    first tuned compile of a structure settles its plan for good: MobileNetV2 at 2 threads, settled on a
    4 us reading, split 17 layers and ran 1.10x ONNX Runtime at 2 threads; split at 1 us, 49 layers and
    0.81x (2026-12-06, same host, interleaved runs)."""
    return cheaper.split and tuned.split and cheaper.speedup * (1 + MIN_MARGIN) >= tuned.speedup


def keeps_built(verdict: Verdict) -> bool:
    """Whether a "whole" verdict keeps the split plan built, its workers off (every part run on the caller),
    instead of building the model again with every layer whole: when the verdict is unsettled (a later
    warm start checks again, :func:`recheck`, and the session's own watch meanwhile turns the workers on
    where they come to pay, :mod:`.worker_watch`) and the serial run takes at least ``KEEP_SPLIT_S``. Its
    parts then cost 1.4-1.7% over the whole plan (ShuffleNetV2 at 1.0-1.6 ms, MobileNetV3-ish at 0.9-1.0,
    Xeon, interleaved), where the rebuild cost 0.7-1.0 s of a 2.6-4 s cold compile; on the small CNN's
    0.03 ms run they cost 3% at the median, 18% at the fastest, and its rebuild little."""
    return not verdict.split and not verdict.settled and verdict.serial_s >= KEEP_SPLIT_S


def margin_for(serial_s: float) -> float:
    """The share of its serial time a model's split must save (:func:`decide`): ``MARGIN`` where a few
    handoffs and a wake-up (``WAKE_S``) are a large share of a run, as on the small CNN, whose split
    ran 0.92x its 1-thread speed at a 10% margin; ``WAKE_S`` of longer runs, and at least ``MIN_MARGIN``
    (the joined run, which the threaded one is timed against, costs about 1% more than the unsplit
    plan). A 15% margin kept MobileNetV3-ish whole at 2 threads on the Xeon though its split saved
    13-14% of 0.44 ms, fastest and median (0.379 against 0.439 ms), and built it a third time for that."""
    return max(MIN_MARGIN, min(MARGIN, WAKE_S / max(serial_s, 1e-9)))


def own_margin(rounds: Sequence[Round]) -> float:
    """The margin a model's check decides at: :func:`margin_for` its fastest serial run of ``rounds``."""
    return margin_for(min(r.serial for r in rounds))


def clearly_split(rounds: Sequence[Round]) -> bool:
    """``EARLY_ROUNDS`` rounds with free cores in which the split saves twice the model's own margin
    (:func:`own_margin`, the margin :func:`check` decides at), fastest and median:
    another round would not turn that verdict, and a cold compile saves the rounds of both sides (ResNet-18
    at 2 threads on the 2-core Zen 4: about 70 ms a round). Over 19 rounds of six checks of ResNet-18 there (2026-12-05), every round's
    saving lay within 44-52%, fastest and median, the first round's as much as the rest: a second round
    only confirmed it. On the Xeon its first round saved 27-44% by the stretch, at times under the 30%
    that twice ``MARGIN`` asked of every model, and the check ran three rounds (0.21 s of a 1.22 s cold
    compile, against 0.06 s for one) for a split saving five times its own margin (5%)."""
    clean = [r for r in rounds if r.clean]
    return len(clean) >= EARLY_ROUNDS and decide(clean, 2 * own_margin(rounds)).split


def _medians(rounds: Sequence[Round]) -> tuple[float, float] | None:
    """The median of the threaded and of the serial medians over ``rounds``, or None when none timed them."""
    timed = [r for r in rounds if r.threaded_median is not None and r.serial_median is not None]
    if not timed:
        return None
    return statistics.median(r.threaded_median for r in timed), statistics.median(r.serial_median for r in timed)


def after_idle(session: Session, runs: int = IDLE_RUNS, gap_s: float = IDLE_GAP_S,
               clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> IdleStarts:
    """Each side's median run when it follows ``gap_s`` of idle, the sides in turn. Back to back, a worker
    still spins when the next job comes; a device that runs the model now and then wakes it from its
    futex first, tens of microseconds a run, which a split of a small model does not save: the small
    CNN at 2 threads on the 2-core Zen 4 ran 17.4 against 21.0 us back to back, 59 against 34 us after
    1 ms idle and 175 against 135 us after 20 ms."""
    inputs = random_inputs(session)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(runs):
        for on in (True, False):
            session.set_workers(on)
            sleep(gap_s)
            t = clock()
            session.run(inputs)
            times[on].append(clock() - t)
    session.set_workers(True)
    return IdleStarts(statistics.median(times[True]), statistics.median(times[False]))


def recheck(settled: bool, age_s: float, threads: int, room: Callable[[int], bool] | None = None) -> bool:
    """Whether a cache entry's split decision is to be taken again: it was left unsettled, the entry is
    ``RECHECK_AFTER_S`` old (a machine that stays busy recompiles a model at most once a minute, and
    a benchmark's warm starts right after its compile stay warm) and the cores have room now
    (``room``, default :func:`.cpu_share.room_for`; read only for such an entry)."""
    return not settled and age_s >= RECHECK_AFTER_S and (room or cpu_share.room_for)(threads)


def random_inputs(session: Session, seed: int = 0) -> dict[str, np.ndarray]:
    """Finite inputs of the session's shapes (float: :func:`~cuvil.compiler.spread.spread`; integer: zeros,
    valid as any index)."""
    return {s.name: (spread(s.shape, seed + i) if s.dtype.numpy.kind == "f" else np.zeros(s.shape)).astype(s.dtype.numpy)
            for i, s in enumerate(session.lowered.inputs)}


def measure(session: Session, round_s: float = ROUND_S, clock: Callable[[], float] = time.perf_counter,
            waited: Callable[[], float | None] = cpu_share.waited_s, early: bool = True) -> tuple[Round, ...]:
    """Interleaved rounds, workers on then joined, until ``CLEAN_ROUNDS`` had free cores (``early``:
    or :func:`clearly_split` holds) or ``MAX_ROUNDS`` ran. Every run copies its inputs in (``run``, not
    ``run_raw``): a run on the arena's leftovers would read indices that later tensors overwrote, and
    time a Gather's fault instead of the model."""
    inputs = random_inputs(session)
    session.run(inputs)
    t = clock()
    session.run(inputs)
    reps = max(MIN_RUNS, int(round_s / max(clock() - t, 1e-7)))

    def timed() -> tuple[float, float]:  # the fastest and the median run
        warm, until = 0, clock() + WARM_S
        while warm < WARM_RUNS or clock() < until:
            session.run(inputs)
            warm += 1
        runs = []
        for _ in range(reps):
            t = clock()
            session.run(inputs)
            runs.append(clock() - t)
        return min(runs), statistics.median(runs)

    rounds: list[Round] = []
    while len(rounds) < MAX_ROUNDS and sum(r.clean for r in rounds) < CLEAN_ROUNDS \
            and not (early and clearly_split(rounds)):
        session.set_workers(True)
        w0, t0 = waited(), clock()
        threaded = timed()
        wall, w1 = clock() - t0, waited()
        session.set_workers(False)
        share = None if w0 is None or w1 is None else (w1 - w0) / max(wall, 1e-9)
        serial = timed()
        rounds.append(Round(threaded[0], serial[0], share, threaded[1], serial[1]))
    session.set_workers(True)
    return tuple(rounds)


def check(session: Session, margin: float | None = None, confirm: bool = False) -> Verdict:
    """:func:`decide` on the session timed both ways, at ``margin`` (default :func:`own_margin`); a model
    that refuses the check's inputs (a run-time check) keeps the cost model's split: nothing could be measured."""
    try:
        rounds = measure(session)
        if margin is None:
            margin = own_margin(rounds)
        back_to_back = decide(rounds, margin)
        idle = after_idle(session) if back_to_back.split and back_to_back.saving_s < IDLE_BELOW_S else None
    except (InterpreterError, RunTimeCheckError):
        return Verdict(True, True, "split as the cost model chose: the model refused the check's random inputs")
    return decide(rounds, margin, confirm, idle)


def unsplit(target: Target) -> Target:
    """``target`` (as tuned) with every layer whole."""
    return dataclasses.replace(target, conv_parts=(),
                               tuning=target.tuning.replace(parallel_sync_ratio=UNSPLIT_RATIO))


def generous(target: Target) -> Target:
    """``target`` split by the cost model at the cheapest handoff there is: the probe reads one of two
    figures, a worker that claims its part at once (1 us) or one that claims it after the caller ran
    its own (the part's length); on a quiet 2-core Zen 4 it read the second in 4 of 5 fresh compiles,
    and MobileNetV2 then split 3 layers and lost, where the 49 layers split at 1 us ran 1.42x its
    1-thread speed. (The caller ran on its worker's CPU then; the probe steps off it since 2026-12-05,
    and a busy second core still reads the second figure.)"""
    from . import pool_probe

    return dataclasses.replace(target, conv_parts=(),
                               tuning=target.tuning.replace(parallel_sync_us=pool_probe.FLOOR_US))


def plans(tuned: Target) -> tuple[Target, ...]:
    """A tuned compile's plans in the order it tries them: the tuned split, then :func:`fallbacks`. A
    settled verdict names its plan by its index here (:mod:`.tuning_record`)."""
    return (tuned, *fallbacks(tuned))


def fallbacks(target: Target) -> tuple[Target, ...]:
    """The plans a compile tries, in turn, after its tuned split was measured not to pay: the split at
    the cheapest handoff (unless that was the plan), then every layer whole. Each is built and checked
    like the first; a plan that splits nothing ends the search, and so does an unsettled verdict
    (the compile goes straight to the last plan: no split is shown to pay without free cores)."""
    from . import pool_probe

    cheaper = (generous(target),) if target.tuning.parallel_sync_us > pool_probe.FLOOR_US else ()
    return cheaper + (unsplit(target),)
