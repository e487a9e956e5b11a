"""Which plan a compile keeps after the whole-model check: the tuned split, the split at the cheapest
handoff, or every layer whole; how a verdict is cached, recorded for the structure's next versions and
taken again; the same bits as 1 thread whatever is kept."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest

from cuvil.edge_runtime import cpu_share, split_check
from cuvil.edge_runtime.compile import compile_graph

from .split_helpers import AVX2, SPLIT_ALL, convs as _convs, feeds, graph, no_probe, split_verdict, verdict  # noqa: F401 (fixtures)


def test_a_split_that_does_not_pay_is_rebuilt_whole_and_cached_so(graph, feeds, monkeypatch, no_probe, tmp_path):
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: verdict(False))
    t0 = time.perf_counter()
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    wall_ms = (time.perf_counter() - t0) * 1e3
    assert two.threads == 2 and two.lowered.split_nodes == 0 and two._stop is None  # no workers to spin or nudge
    st = two.stats  # each build's lowering and LLVM counted once, the rebuilds' too: no share below zero
    assert min(st.lower_ms, st.llvm_ms, st.load_ms) >= 0 and st.cache_ms + st.lower_ms + st.llvm_ms + st.load_ms <= wall_ms
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: verdict(True))  # a cache hit: nothing measured again
    again = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert again.stats.cache_hit and again.lowered.split_nodes == 0


def test_a_split_that_pays_is_kept_and_timed_both_ways(graph, feeds, monkeypatch, no_probe, tmp_path):
    seen = []
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: seen.append(split_check.measure(session)) or verdict(True))
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert two.lowered.split_nodes == 2 and two._stop.alive  # the workers run again after the check
    ((*_, last),) = seen
    assert all(math.isfinite(t) and 0 < t < 1 for t in (last.threaded, last.serial))
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    two.close()
    two.set_workers(True)  # closed stays closed: nothing left to join
    assert not two._stop.alive


@pytest.mark.parametrize("verdicts, split_nodes, sync_us", [((False, True), 2, 1.0), ((False, False), 0, 4.0)])
def test_a_split_at_a_dear_handoff_that_does_not_pay_is_tried_at_the_cheapest(graph, feeds, monkeypatch, no_probe,
                                                                               tmp_path, verdicts, split_nodes, sync_us):
    from cuvil.edge_runtime import pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: 4.0)
    said = iter(verdicts)
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: verdict(next(said)))
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert two.lowered.split_nodes == split_nodes and two.lowered.target.tuning.parallel_sync_us == sync_us
    assert next(said, None) is None  # each plan that splits was checked once; the whole one is not
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    two.close()


@pytest.mark.parametrize("speedups, sync_us, split_nodes, builds", [((1.3, 1.8), 1.0, 2, 2), ((1.5, 1.2), 4.0, 1, 3),
                                                                     ((1.7, 1.9), 4.0, 1, 1)])
def test_a_paying_split_at_a_dear_handoff_is_checked_against_the_split_at_the_cheapest(
        feeds, monkeypatch, no_probe, tmp_path, speedups, sync_us, split_nodes, builds):
    """The probe read 4 us: the first conv (663k multiply-adds) stays whole there and splits at 1 us. Both
    plans pay; the one that ran faster against its own serial run is kept (the tuned one taken back: its code
    from its first build, its weights packed again, no third build), settled in the CPU's record for the
    structure's next versions."""
    from cuvil.edge_runtime import compile as compile_mod, pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: 4.0)
    said, built, build = iter(speedups), [], compile_mod._build
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: split_verdict(next(said)))
    monkeypatch.setattr(compile_mod, "_build", lambda *a, **k: built.append(1) or build(*a, **k))
    channels = ((8, 64), (64, 32))
    two = compile_graph(_convs(1, channels), AVX2, cache_dir=tmp_path, tune=True, threads=2)
    assert two.stats.builds == builds and (next(said, None) is None) is (builds > 1)  # 1.7x at 2 threads: good enough
    assert len(built) == min(builds, 2)  # the tuned split taken back is not built a third time
    assert two.lowered.split_nodes == split_nodes and two.lowered.target.tuning.parallel_sync_us == sync_us
    assert two.lowered.split_settled and (f"{speedups[1]:.2f}x" in two.lowered.split_reason) is (builds > 1)
    one = compile_graph(_convs(1, channels), AVX2, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    monkeypatch.setattr(pool_probe, "handoff_us", _refuse)
    monkeypatch.setattr(split_check, "check", _refuse)
    version2 = compile_graph(_convs(2, channels), AVX2, cache_dir=tmp_path, tune=True, threads=2)
    assert version2.lowered.split_nodes == split_nodes and version2.lowered.target.tuning.parallel_sync_us == sync_us
    for s in (two, version2):
        s.close()


def test_a_paying_split_that_the_cheapest_handoff_would_not_change_is_built_once(graph, monkeypatch, no_probe, tmp_path):
    from cuvil.edge_runtime import compile as compile_mod, pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: 4.0)
    checked, built, build = [], [], compile_mod._build
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: checked.append(1) or split_verdict(1.5))
    monkeypatch.setattr(compile_mod, "_build", lambda *a, **k: built.append(1) or build(*a, **k))
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)  # every layer splits at any handoff
    assert checked == [1] and built == [1] and two.lowered.target.tuning.parallel_sync_us == 4.0
    two.close()


def test_a_whole_verdict_taken_without_free_cores_is_taken_again_once_the_cores_have_room(
        graph, feeds, monkeypatch, no_probe, tmp_path):
    from cuvil.edge_runtime import pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: 4.0)  # a cheaper plan is there to try
    checked = []
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: checked.append(session.lowered.split_nodes) or verdict(False, False))
    busy = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert checked == [2] and busy.lowered.split_nodes == 0  # unsettled: straight to whole, the 1 us plan not built
    assert not busy.lowered.split_settled and "test" in busy.lowered.split_reason
    monkeypatch.setattr(cpu_share, "room_for", lambda threads: True)
    young = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)  # under a minute old
    assert young.stats.cache_hit and young.lowered.split_nodes == 0
    monkeypatch.setattr(split_check, "RECHECK_AFTER_S", 0.0)
    monkeypatch.setattr(cpu_share, "room_for", lambda threads: False)  # still busy: the entry serves as it is
    still = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert still.stats.cache_hit and still.lowered.split_nodes == 0 and not still.lowered.split_settled
    monkeypatch.setattr(cpu_share, "room_for", lambda threads: True)
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: checked.append(session.lowered.split_nodes) or verdict(True))
    quiet = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert not quiet.stats.cache_hit and quiet.lowered.split_nodes == 2 and quiet.lowered.split_settled
    again = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert again.stats.cache_hit and again.lowered.split_nodes == 2 and again.lowered.split_reason == quiet.lowered.split_reason
    assert checked == [2, 2]  # a settled entry is never checked again
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    assert all(one[k].tobytes() == v.tobytes() for k, v in again.run(feeds).items())
    for s in (busy, young, still, quiet, again):
        s.close()


def test_a_whole_verdict_on_free_cores_is_settled_by_a_second_check_on_a_later_warm_start(
        graph, monkeypatch, no_probe, tmp_path):
    asked = []

    def whole(session, confirm=False):  # free cores, no gain: as a real check of a short model that does not pay
        asked.append(confirm)
        return split_check.decide([split_check.Round(1e-4, 1e-4)] * 3, confirm=confirm)

    monkeypatch.setattr(split_check, "check", whole)
    first = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert first.lowered.split_nodes == 0 and not first.lowered.split_settled and asked == [False]
    monkeypatch.setattr(split_check, "RECHECK_AFTER_S", 0.0)
    monkeypatch.setattr(cpu_share, "room_for", lambda threads: True)
    second = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert not second.stats.cache_hit and second.lowered.split_settled and asked[-1] is True
    third = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert third.stats.cache_hit and third.lowered.split_settled and third.lowered.split_nodes == 0
    checks = len(asked)
    compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert len(asked) == checks  # settled: never checked again
    for s in (first, second, third):
        s.close()


def test_weights_packed_again_are_taken_only_when_they_come_out_as_the_build_befores(graph):
    """The tuned split taken back after the cheaper one lost keeps its first build's code; its weights are
    packed again without kernel IR, and used only when they match what that build packed."""
    import dataclasses

    import numpy as np

    from cuvil.compiler.codegen.lower import lower
    from cuvil.edge_runtime.plan_search import repacked, weights_digest

    plan = dataclasses.replace(SPLIT_ALL, threads=2)
    built = lower(graph, plan)
    stripped = dataclasses.replace(built, weights=b"")
    again = repacked((stripped, [], weights_digest(built.weights)), graph, plan, plan, 1, True, False)
    assert again is not None and again.plan == built.plan and again.entry == built.entry
    assert np.asarray(again.weights).tobytes() == np.asarray(built.weights).tobytes()
    other = np.asarray(built.weights).copy().reshape(-1).view(np.uint8)
    other[0] ^= 1  # a block packed otherwise: its digest differs
    assert repacked((stripped, [], weights_digest(other)), graph, plan, plan, 1, True, False) is None


def _native_threads() -> int:
    """This process's threads that Python did not start (a session's workers), once a cold compile's
    entry is written and the Python threads that just ended are gone from ``/proc`` too: the same count
    twice, 10 ms apart (Python's threads are listed first, so one ending meanwhile is in neither)."""
    from cuvil.edge_runtime.cache import finish_writes

    finish_writes()
    counts = []
    while len(counts) < 2 or counts[-1] != counts[-2]:
        time.sleep(0.01 if counts else 0)
        python = {t.native_id for t in threading.enumerate()}
        counts.append(len({int(tid) for tid in os.listdir("/proc/self/task")} - python))
        assert len(counts) < 200, f"the thread count did not settle: {counts[-5:]}"
    return counts[-1]


@pytest.mark.parametrize("serial_s, kept", [(2 * split_check.KEEP_SPLIT_S, True), (split_check.KEEP_SPLIT_S / 2, False)])
def test_an_unsettled_whole_on_a_long_run_keeps_its_split_build_with_the_workers_off(
        graph, feeds, monkeypatch, no_probe, tmp_path, serial_s, kept):
    """A rebuild with every layer whole cost ShuffleNetV2 and MobileNetV3-ish 0.7-1.0 s of their cold compile
    for runs 1.4-1.7% faster than their split build's with the workers off; a short run is built whole."""
    from cuvil.edge_runtime import compile as compile_mod

    unsettled = split_check.Verdict(False, False, "whole, unsettled (a test's verdict)", serial_s=serial_s)
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path / "one", tune=False, threads=1).run(feeds)
    built, build = [], compile_mod._build
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: unsettled)
    monkeypatch.setattr(compile_mod, "_build", lambda *a, **k: built.append(1) or build(*a, **k))
    before = _native_threads()
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert len(built) == two.stats.builds == (1 if kept else 2) and two.lowered.split_nodes == (2 if kept else 0)
    assert two.lowered.workers is not kept and not two.lowered.split_settled
    assert ("split build kept" in two.lowered.split_reason) is kept
    assert _native_threads() == before  # no worker started either way
    assert all(one[k].tobytes() == v.tobytes() for k, v in two.run(feeds).items())
    warm = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert warm.stats.cache_hit and warm.lowered.workers is not kept and _native_threads() == before
    if kept:  # what the session's watch does once the workers pay: the same bits on them
        warm.set_workers(True)
        assert _native_threads() == before + 1
        assert all(one[k].tobytes() == v.tobytes() for k, v in warm.run(feeds).items())
    for s in (two, warm):
        s.close()
    assert _native_threads() == before


@pytest.mark.parametrize("split", [True, False])
def test_a_kept_split_build_is_checked_again_on_a_later_warm_start_as_it_is(
        graph, feeds, monkeypatch, no_probe, tmp_path, split):
    """An entry built whole is compiled again to be checked; a kept split build is timed as loaded, and
    a settled verdict goes to its entry: workers on for a split that pays, off for a second "whole"."""
    from cuvil.edge_runtime import compile as compile_mod
    from cuvil.edge_runtime.cache import finish_writes

    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path / "one", tune=False, threads=1).run(feeds)
    asked = []
    unsettled = split_check.Verdict(False, False, "whole, unsettled (a test's verdict)", serial_s=1.0)
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: asked.append(confirm) or unsettled)
    first = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert first.lowered.split_nodes == 2 and not first.lowered.workers and asked == [False]
    first.close()
    built, build = [], compile_mod._build
    monkeypatch.setattr(compile_mod, "_build", lambda *a, **k: built.append(1) or build(*a, **k))
    monkeypatch.setattr(split_check, "RECHECK_AFTER_S", 30.0)
    monkeypatch.setattr(cpu_share, "room_for", lambda threads: True)
    finish_writes()
    (entry,) = tmp_path.glob("*.cuvil-art")
    os.utime(entry, (time.time() - 100, time.time() - 100))  # written 100 s ago
    still = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)  # unsettled again: as it was
    assert still.stats.cache_hit and not still.lowered.split_settled
    assert asked == [False, True] and not still.lowered.workers
    still.close()
    assert compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2).stats.cache_hit
    assert len(asked) == 2  # its age restarted: not checked again within RECHECK_AFTER_S
    monkeypatch.setattr(split_check, "RECHECK_AFTER_S", 0.0)
    before = _native_threads()
    settled = verdict(split) if split else split_check.Verdict(False, True, "whole (a test's verdict)", serial_s=1.0)
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: asked.append(confirm) or settled)
    second = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert second.stats.cache_hit and not built and second.stats.builds == 0 and asked == [False, True, True]
    assert second.lowered.split_settled and second.lowered.workers is split and second.lowered.split_nodes == 2
    assert _native_threads() == before + split
    assert all(one[k].tobytes() == v.tobytes() for k, v in second.run(feeds).items())
    second.close()
    third = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert third.stats.cache_hit and len(asked) == 3 and not built  # settled in the entry: never checked again
    assert third.lowered.split_settled and third.lowered.workers is split and "warm start" in third.lowered.split_reason
    third.close()


def _refuse(*args, **kwargs):
    raise AssertionError("measured, where the tuning record had settled it")


@pytest.mark.parametrize("verdicts, handoff, split_nodes, sync_us", [
    ((True,), 1.0, 2, 1.0),  # the tuned split paid
    ((False,), 1.0, 0, 1.0),  # it did not, on free cores: every layer whole
    ((False, True), 4.0, 2, 1.0),  # the split at the cheapest handoff paid where the probe's did not
])
def test_a_settled_plan_holds_for_the_structures_next_versions(feeds, monkeypatch, no_probe, tmp_path, verdicts,
                                                               handoff, split_nodes, sync_us):
    """A rollout's next version (the same layers, new weights) builds the plan its structure settled
    on at once: no handoff probe, no check, no rebuild; another structure is checked as before."""
    from cuvil.edge_runtime import pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: handoff)
    said = iter(verdicts)
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: verdict(next(said)))
    first = compile_graph(_convs(1), SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert first.lowered.split_nodes == split_nodes and first.lowered.split_settled and next(said, None) is None
    monkeypatch.setattr(pool_probe, "handoff_us", _refuse)
    monkeypatch.setattr(split_check, "check", _refuse)
    version2 = _convs(2)
    second = compile_graph(version2, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert not second.stats.cache_hit and second.lowered.split_nodes == split_nodes and second.lowered.split_settled
    assert second.lowered.target.tuning.parallel_sync_us == sync_us and "tuning record" in second.lowered.split_reason
    assert (second._stop is None) == (split_nodes == 0)  # a whole plan starts no workers
    one = compile_graph(version2, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1).run(feeds)
    assert all(one[k].tobytes() == v.tobytes() for k, v in second.run(feeds).items())
    with pytest.raises(AssertionError, match="measured"):  # another structure is not the record's
        compile_graph(_convs(2, ((8, 32), (32, 16))), SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    for s in (first, second):
        s.close()


def test_an_unsettled_verdict_records_nothing(feeds, monkeypatch, no_probe, tmp_path):
    checked = []
    monkeypatch.setattr(split_check, "check", lambda session, confirm=False: checked.append(1) or verdict(False, False))
    for seed in (1, 2):  # busy cores in both: the second version is checked again
        s = compile_graph(_convs(seed), SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
        assert s.lowered.split_nodes == 0 and not s.lowered.split_settled
    assert checked == [1, 1]


def test_a_rejected_split_is_let_go_before_the_next_plan_is_built(graph, monkeypatch, no_probe, tmp_path):
    """Each plan is a whole model's packed weights and code: a rebuild beside the rejected one peaked
    higher (ResNet-18 at 2 threads, the check forced to "whole": 262 against 205 MiB)."""
    import weakref

    from cuvil.edge_runtime import compile as compile_mod

    rejected, held_at_rebuild, build = [], [], compile_mod._build
    monkeypatch.setattr(split_check, "check",
                        lambda session, confirm=False: rejected.append(weakref.ref(session.lowered)) or verdict(False))
    monkeypatch.setattr(compile_mod, "_build", lambda *a, **k: held_at_rebuild.extend(r() is not None for r in rejected)
                        or build(*a, **k))
    two = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=True, threads=2)
    assert two.lowered.split_nodes == 0 and rejected and held_at_rebuild == [False] * len(rejected)
