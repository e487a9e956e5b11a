"""The calling thread steps off its pinned workers' CPUs before a run, and keeps its own mask."""

from __future__ import annotations

import ctypes
import dataclasses
import os

import numpy as np
import pytest

from cuvil.edge_runtime import placement
from cuvil.edge_runtime.compile import compile_graph
from cuvil.edge_runtime.placement import CallerPlacement

from .split_helpers import SPLIT_ALL, convs as _convs

LINUX_AFFINITY = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


@pytest.fixture
def four_cpus(monkeypatch):
    """A thread whose mask holds CPUs 0-3; each mask the code sets is recorded (and becomes the mask)."""
    state = {"mask": {0, 1, 2, 3}, "set": []}

    def set_mask(pid, cpus):
        state["set"].append(set(cpus))
        state["mask"] = set(cpus)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(state["mask"]), raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", set_mask, raising=False)
    return state


def test_on_a_workers_cpu_the_caller_narrows_its_mask_to_the_others_then_restores_it(four_cpus):
    place = CallerPlacement(3, getcpu=lambda: 2)  # workers on CPUs 1 and 2; the caller runs on 2
    assert place.workers == {1, 2} and place.others == {0, 3}
    assert place.step_aside() is True
    assert four_cpus["set"] == [{0, 3}, {0, 1, 2, 3}] and four_cpus["mask"] == {0, 1, 2, 3}


def test_elsewhere_nothing_is_set(four_cpus):
    assert CallerPlacement(3, getcpu=lambda: 3).step_aside() is False
    assert four_cpus["set"] == []


def test_a_caller_confined_to_the_workers_cpus_stays(four_cpus):
    place = CallerPlacement(2, getcpu=lambda: 1)
    four_cpus["mask"] = {1}  # the user narrowed this thread since the workers started
    assert place.step_aside() is False and four_cpus["set"] == []


def test_a_refused_affinity_call_is_no_error(four_cpus, monkeypatch):
    def refuse(pid, cpus):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    assert CallerPlacement(2, getcpu=lambda: 1).step_aside() is False


@pytest.mark.parametrize("mask", [{0}, set()])
def test_without_a_cpu_for_a_worker_there_is_nothing_to_do(four_cpus, mask):
    four_cpus["mask"] = mask
    place = CallerPlacement(2, getcpu=lambda: 0)
    assert place.workers == frozenset() and place.step_aside() is False and four_cpus["set"] == []


@pytest.mark.skipif(not LINUX_AFFINITY or len(os.sched_getaffinity(0)) < 2, reason="Linux with two CPUs or more")
def test_the_real_thread_leaves_the_workers_cpu_with_its_mask_intact():
    getcpu = placement._sched_getcpu()
    if getcpu is None:
        pytest.skip("the C library has no sched_getcpu")
    mask = os.sched_getaffinity(0)
    place = CallerPlacement(2)
    (worker,) = place.workers
    try:
        os.sched_setaffinity(0, {worker})  # onto the worker's CPU (the scheduler's choice after a sleep)
        os.sched_setaffinity(0, mask)
        place.step_aside()
        assert getcpu() not in place.workers
    finally:
        os.sched_setaffinity(0, mask)
    assert os.sched_getaffinity(0) == mask


@pytest.mark.parametrize("threads, pin, placed", [(2, True, True), (2, False, False), (1, True, False)])
def test_a_session_with_pinned_workers_places_its_caller_before_each_run(monkeypatch, threads, pin, placed):
    if placed and (not LINUX_AFFINITY or len(os.sched_getaffinity(0)) < 2):
        pytest.skip("a worker's own CPU: Linux with two CPUs or more")
    calls = []
    monkeypatch.setattr(CallerPlacement, "step_aside", lambda self: calls.append(self) if self.workers else None)
    target = dataclasses.replace(SPLIT_ALL, threads=threads, tuning=SPLIT_ALL.tuning.replace(pool_pin=pin))
    graph = _convs(1)
    session = compile_graph(graph, target, use_cache=False, tune=False)
    x = np.ones((1, 8, 12, 12), np.float32)
    session.run({graph.inputs[0]: x})
    session.run_each(x[None])
    session.run_raw()
    assert len(calls) == (3 if placed else 0)  # a placement with workers' CPUs before each of the three paths
    assert threads == 1 or session.lowered.split_nodes  # at 2 threads the convs split: workers run
    session.close()


def test_sched_getcpu_reads_a_cpu_of_this_threads_mask():
    getcpu = placement._sched_getcpu()
    if getcpu is None or not LINUX_AFFINITY:
        pytest.skip("no sched_getcpu or affinity calls here")
    assert isinstance(getcpu, ctypes._CFuncPtr) and getcpu() in os.sched_getaffinity(0)
