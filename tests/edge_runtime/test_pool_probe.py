"""The pool's handoff, measured on this machine, becomes the tuned target's sync cost and so decides
which layers split."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from cuvil.devices import resolve_target
from cuvil.edge_runtime import autotune, pool_probe
from cuvil.edge_runtime.pool_probe import PART_US, Probe

AVX2 = resolve_target("x86-avx2")  # runs on every build host


def test_the_probe_times_a_part_and_the_pools_handoff():
    probe = Probe(dataclasses.replace(AVX2, threads=2))
    try:
        part_us = min(Probe._seconds(probe.part) for _ in range(20)) * 1e6
        assert PART_US / 4 < part_us < PART_US * 10  # calibrated to about PART_US (a busy CPU only adds)
        sync = probe.handoff_us(samples=20)
        assert math.isfinite(sync) and 0.0 <= sync < 10 * PART_US * probe.threads
    finally:
        probe.close()
    probe.shared()  # joined: the caller runs every part itself, nothing waits for a worker


@pytest.mark.parametrize("pin", [True, False])
def test_the_caller_steps_off_the_workers_cpus_before_each_pair(monkeypatch, pin):
    """As a session's caller does before each run: on a worker's CPU it would run the worker's part first."""
    made, stepped = [], []

    class Placement:
        def __init__(self, threads):
            made.append(threads)

        def step_aside(self):
            stepped.append(1)
            return False
    monkeypatch.setattr(pool_probe, "CallerPlacement", Placement)
    probe = Probe(dataclasses.replace(AVX2, threads=2, tuning=AVX2.tuning.replace(pool_pin=pin)))
    try:
        probe.handoff_us(samples=7)
    finally:
        probe.close()
    assert made == [2 if pin else 1] and len(stepped) == 7  # unpinned workers hold no CPU of their own


@pytest.fixture(scope="module")
def conv_graph():
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    b = GraphBuilder("conv")
    x = b.input("x", TensorType.parse("f32[1,8,8,8]"))
    w = b.constant(np.ones((8, 8, 3, 3), np.float32), "w")
    return b.build([b.add1("Conv", [x, w], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_tuner_puts_the_measured_handoff_in_the_target(conv_graph, monkeypatch, threads):
    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: 123.5)
    monkeypatch.setattr(autotune, "tune", lambda graph, target, llvm=None, known=None: autotune.TuneReport((), 0, 0.0, 0.0))
    tuner = autotune.Retarget()
    tuned = tuner(conv_graph, dataclasses.replace(AVX2, threads=threads))
    if threads == 1:  # nothing is handed over at one thread: nothing measured
        assert tuner.report.sync_us is None and tuned.tuning.parallel_sync_us == AVX2.tuning.parallel_sync_us
    else:
        assert tuner.report.sync_us == 123.5 and tuned.tuning.parallel_sync_us == 123.5


def test_a_model_without_convs_keeps_the_profiles_handoff(monkeypatch):
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    b = GraphBuilder("tokens")
    x = b.input("x", TensorType.parse("f32[1,32,64]"))
    graph = b.build([b.add1("MatMul", [x, b.constant(np.ones((64, 192), np.float32), "w")])])
    asked = []
    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: asked.append(target) or 0.5)
    tuned = autotune.Retarget()(graph, dataclasses.replace(AVX2, threads=2))
    assert not asked and tuned.tuning.parallel_sync_us == AVX2.tuning.parallel_sync_us  # see the autotune module


def test_the_kept_handoff_is_on_the_grid_and_at_most_the_profiles():
    capped = dataclasses.replace(AVX2, threads=2, tuning=AVX2.tuning.replace(parallel_sync_us=3.0))
    assert pool_probe.handoff_us(capped) in (1.0, 2.0, 3.0)  # a busy machine reads 20 us or more: capped


def test_blocks_stop_once_one_reads_the_grids_first_step(monkeypatch):
    """The least block decides; once a block reads ``FLOOR_US`` or less no later one can change the result, so
    none is measured (~25 ms of a cold compile); above it, every block is."""
    reads = []

    class Scripted:
        def __init__(self, target, llvm=None):
            pass

        def handoff_us(self, samples):
            return reads.pop(0)

        def close(self):
            pass

    monkeypatch.setattr(pool_probe, "Probe", Scripted)
    monkeypatch.setattr(pool_probe, "BLOCK_GAP_S", 0.0)
    monkeypatch.setattr(pool_probe, "_MEASURED", {})
    target = dataclasses.replace(AVX2, threads=2, tuning=AVX2.tuning.replace(parallel_sync_us=64.0))
    reads[:] = [19.0, 0.4, 18.0, 0.2, 20.0]
    assert pool_probe.handoff_us(target) == 1.0 and reads == [18.0, 0.2, 20.0]
    monkeypatch.setattr(pool_probe, "_MEASURED", {})
    reads[:] = [19.0, 3.5, 18.0, 2.5, 20.0]
    assert pool_probe.handoff_us(target) == 4.0 and reads == []
