"""A split session re-times itself with its workers and without them now and then, on its own runs,
and keeps the faster way; the answer is the same bits either way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target
from cuvil.edge_runtime.compile import compile_graph
from cuvil.edge_runtime.worker_watch import MARGIN, WorkerWatch

AVX2 = resolve_target("x86-avx2")  # runs on every build host
SPLIT_ALL = dataclasses.replace(AVX2, threads=2, tuning=AVX2.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))


class _Runs:
    """Feeds a watch runs whose time depends on the way the session runs at that moment."""

    def __init__(self, on_s: float, off_s: float, interval: float = 10.0, runs: int = 4, workers: bool = True):
        self.calls: list[bool] = []
        self.on_s, self.off_s, self.t = on_s, off_s, 0.0
        self.watch = WorkerWatch(interval, runs, self._set, now=0.0, workers=workers)
        self.running = workers

    def _set(self, workers: bool) -> None:
        self.calls.append(workers)
        self.running = workers

    def run(self, count: int = 1, first_s: float | None = None) -> None:
        for i in range(count):
            took = self.on_s if self.running else self.off_s
            took = first_s if (first_s is not None and i == 0) else took
            self.t += took
            self.watch.observe(took, self.t)


def test_nothing_is_timed_before_the_interval():
    runs = _Runs(on_s=2.0, off_s=1.0, interval=10.0)
    runs.run(4)  # 8 s: not due yet
    assert runs.calls == [] and runs.watch.workers


def test_workers_that_lose_are_joined_and_started_again_when_they_win():
    runs = _Runs(on_s=2.0, off_s=1.0, interval=10.0, runs=4)
    runs.run(5)  # the fifth run ends at 10 s: a trial starts, workers on (as they are)
    runs.run(5)  # 1 settling + 4 timed with workers
    assert runs.calls == [False]  # now the other way
    runs.run(5)  # 1 settling + 4 timed without: off is faster, so it stays off
    assert runs.calls == [False] and not runs.watch.workers and not runs.running
    runs.on_s = 0.5  # the cores moved closer: workers win now
    runs.run(20)  # the next trial: with workers, without, then with them for good
    assert runs.calls == [False, True, False, True] and runs.watch.workers and runs.running


@pytest.mark.parametrize("on_s, calls", [(0.5, [True, False, True]), (2.0, [True, False])])
def test_a_session_that_starts_with_its_workers_off_tries_them_at_its_first_trial(on_s, calls):
    """A split build the compile kept whole (``LoweredModel.workers`` off) runs its parts on the caller;
    its first trial starts the workers, and they stay on only when they win."""
    runs = _Runs(on_s=on_s, off_s=1.0, interval=10.0, runs=4, workers=False)
    runs.run(10)  # ends at 10 s: the trial starts with the workers on
    assert runs.calls == [True]
    runs.run(10)  # 1 settling + 4 timed each way
    assert runs.calls == calls and runs.watch.workers is (on_s < 1.0) and runs.running is (on_s < 1.0)


def test_the_first_run_of_each_way_does_not_count():
    runs = _Runs(on_s=1.0, off_s=1.2, interval=1.0, runs=3)
    runs.run(1)
    runs.run(4, first_s=50.0)  # a thread start's slow first run, with workers
    runs.run(4)
    assert runs.watch.workers and runs.calls == [False, True]


@pytest.mark.parametrize("off_s, keeps", [(1.0 - MARGIN / 2, True), (1.0 - 2 * MARGIN, False)])
def test_the_way_it_runs_is_left_only_for_one_faster_by_the_margin(off_s, keeps):
    runs = _Runs(on_s=1.0, off_s=off_s, interval=1.0, runs=3)
    runs.run(1 + 4 + 4)
    assert runs.watch.workers is keeps


def test_a_split_session_switches_on_its_own_runs_and_gives_the_same_bits():
    rng = np.random.default_rng(0)
    b = GraphBuilder("convs")
    x = b.input("x", TensorType.parse("f32[1,8,12,12]"))
    for c, oc in ((8, 32), (32, 32)):
        x = b.add1("Conv", [x, b.constant(rng.standard_normal((oc, c, 3, 3)).astype(np.float32))],
                   pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
    graph = b.build([x])
    target = dataclasses.replace(SPLIT_ALL, tuning=SPLIT_ALL.tuning.replace(worker_watch_s=5.0, worker_watch_runs=2))
    session = compile_graph(graph, target=target, use_cache=False, tune=False)
    assert session.lowered.split_nodes == 2
    feeds = {"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)}
    want = next(iter(session.run(feeds).values()))
    ticks = iter(np.arange(0, 10_000, 1.0))  # each clock read 1 s later: every run "takes" 1 s
    session.watch_workers(clock=lambda: float(next(ticks)))
    switched = []
    session._switch_workers = lambda on, real=session._switch_workers: (switched.append(on), real(on))
    session._watch.set_workers = session._switch_workers
    for _ in range(12):
        assert np.array_equal(next(iter(session.run(feeds).values())), want)
    assert switched == [False, True]  # equal times: the trial ran without workers, then kept them (no margin)
    assert session._watch.workers
    session.set_workers(False)  # the caller's choice stands
    assert session._watch is None
    assert np.array_equal(next(iter(session.run(feeds).values())), want)
    session.close()


def test_a_whole_model_is_not_watched():
    rng = np.random.default_rng(0)
    b = GraphBuilder("relu")
    x = b.input("x", TensorType.parse("f32[1,8]"))
    session = compile_graph(b.build([b.add1("Relu", [x])]), target=dataclasses.replace(AVX2, threads=2),
                            use_cache=False, tune=False)
    session.watch_workers()
    assert session._watch is None
    got = next(iter(session.run({"x": rng.standard_normal((1, 8)).astype(np.float32)}).values()))
    assert got.shape == (1, 8) and (got >= 0).all()
