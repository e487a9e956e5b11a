"""The whole-model check keeps a compile's split only when the workers make the model faster;
otherwise the model is rebuilt whole and runs the 1-thread code, with no workers at all."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target
from cuvil.edge_runtime import split_check
from cuvil.edge_runtime.compile import compile_graph
from cuvil.edge_runtime.pool_probe import grid_us

AVX2 = resolve_target("x86-avx2")  # runs on every build host
SPLIT_ALL = dataclasses.replace(AVX2, tuning=AVX2.tuning.replace(parallel_sync_ratio=0.0))


@pytest.fixture(scope="module")
def graph():
    rng = np.random.default_rng(1)
    b = GraphBuilder("two_convs")
    x = b.input("x", TensorType.parse("f32[1,8,12,12]"))
    for c, oc in ((8, 32), (32, 32)):
        w = b.constant(rng.standard_normal((oc, c, 3, 3)).astype(np.float32))
        x = b.add1("Conv", [x, w], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
    return b.build([x])


@pytest.fixture
def feeds(graph):
    return {graph.inputs[0]: np.random.default_rng(2).standard_normal((1, 8, 12, 12)).astype(np.float32)}


@pytest.fixture
def no_probe(monkeypatch):
    """The tuner's handoff probe and kernel timing are not what these tests are about."""
    from cuvil.edge_runtime import autotune, pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target: 1.0)
    monkeypatch.setattr(autotune, "tune", lambda graph, target, llvm=None: autotune.TuneReport((), 0, 0.0, 0.0))


@pytest.mark.parametrize("measured, rounded", [(0.0, 1.0), (0.4, 1.0), (1.0, 1.0), (1.1, 2.0), (6.5, 8.0), (8.0, 8.0), (9.0, 16.0)])
def test_the_handoff_is_kept_on_a_power_of_two_grid(measured, rounded):
    assert grid_us(measured) == rounded


@pytest.mark.parametrize("threaded, serial, pays", [(0.5, 1.0, True), (0.84, 1.0, True), (0.86, 1.0, False), (1.0, 1.0, False), (1.3, 1.0, False)])
def test_the_split_must_save_a_margin(monkeypatch, threaded, serial, pays):
    monkeypatch.setattr(split_check, "timed_rounds", lambda session: (threaded, serial))
    assert split_check.split_pays(None) is pays


def test_a_model_that_refuses_the_checks_inputs_keeps_its_split(monkeypatch):
    from cuvil.compiler.errors import RunTimeCheckError

    def refuse(session):
        raise RunTimeCheckError()
    monkeypatch.setattr(split_check, "timed_rounds", refuse)
    assert split_check.split_pays(None) is True


def test_a_split_that_does_not_pay_is_rebuilt_whole_and_cached_so(graph, feeds, monkeypatch, no_probe, tmp_path):
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    monkeypatch.setattr(split_check, "split_pays", lambda session: False)
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert two.threads == 2 and two.lowered.split_nodes == 0 and two._stop is None  # no workers to spin or nudge
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    monkeypatch.setattr(split_check, "split_pays", lambda session: True)  # a cache hit: nothing measured again
    again = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert again.stats.cache_hit and again.lowered.split_nodes == 0


def test_a_split_that_pays_is_kept_and_timed_both_ways(graph, feeds, monkeypatch, no_probe, tmp_path):
    seen = []
    monkeypatch.setattr(split_check, "split_pays", lambda session: seen.append(split_check.timed_rounds(session, rounds=2)) or True)
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert two.lowered.split_nodes == 2 and two._stop.alive  # the workers run again after the check
    ((threaded, serial),) = seen
    assert all(math.isfinite(t) and 0 < t < 1 for t in (threaded, serial))
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    two.close()
    two.set_workers(True)  # closed stays closed: nothing left to join
    assert not two._stop.alive


@pytest.mark.parametrize("verdicts, split_nodes, sync_us", [((False, True), 2, 1.0), ((False, False), 0, 4.0)])
def test_a_split_at_a_dear_handoff_that_does_not_pay_is_tried_at_the_cheapest(graph, feeds, monkeypatch, no_probe,
                                                                               tmp_path, verdicts, split_nodes, sync_us):
    from cuvil.edge_runtime import pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target: 4.0)
    said = iter(verdicts)
    monkeypatch.setattr(split_check, "split_pays", lambda session: next(said))
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert two.lowered.split_nodes == split_nodes and two.lowered.target.tuning.parallel_sync_us == sync_us
    assert next(said, None) is None  # each plan that splits was checked once; the whole one is not
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    two.close()


def test_a_split_made_at_the_cheapest_handoff_falls_back_to_whole_only():
    cheapest = dataclasses.replace(AVX2, tuning=AVX2.tuning.replace(parallel_sync_us=1.0))
    (whole,) = split_check.fallbacks(cheapest)
    assert whole.tuning.parallel_sync_ratio == split_check.UNSPLIT_RATIO and whole.conv_parts == ()
