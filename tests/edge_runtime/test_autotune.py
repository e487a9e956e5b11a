"""On-device autotuning: the choice rule, the budget, and tuned sessions that compute the same model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuvil.compiler.target import ConvChoice
from cuvil.devices.detect import cpu_identity
from cuvil.compiler.codegen.cpu.kernels.conv import tunable_convs
from cuvil.edge_runtime.autotune import MARGIN, pick, tune, worth_timing
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import compile_graph
from cuvil.edge_runtime.levels import LIGHT_LEVEL
from cuvil.edge_runtime.tuning_record import Known

from ..hosts import HOST

A, B, C = ConvChoice("direct", 4, 3, 8), ConvChoice("winograd", 4, 1, 8), ConvChoice("im2col", 6, 2, 8)


def test_pick_keeps_the_cost_models_choice_unless_clearly_faster():
    assert pick(A, {A: (1.0,), B: (1.0 - MARGIN / 2,)}) == A
    assert pick(A, {A: (1.0,), B: (0.5,), C: (0.7,)}) == B
    assert pick(A, {A: (1.0,), B: (1.2,)}) == A


def test_pick_breaks_ties_by_candidate_order():
    assert pick(A, {A: (1.0,), B: (0.5,), C: (0.5,)}) == B
    assert pick(A, {A: (1.0,), C: (0.5,), B: (0.5,)}) == C


def test_a_candidate_must_be_faster_in_every_round():
    # B's best round is far ahead, but in the third round (a burst hit A's turn less) it lost
    assert pick(A, {A: (1.0, 1.0, 0.9, 1.0), B: (0.6, 0.7, 0.95, 0.6)}) == A
    assert pick(A, {A: (1.0, 1.0, 0.9, 1.0), B: (0.6, 0.7, 0.85, 0.6), C: (0.5, 0.9, 0.95, 0.9)}) == B
    # faster in every round, but its best round is not MARGIN ahead of A's best
    assert pick(A, {A: (1.0, 1.4, 1.2), B: (0.95, 1.0, 1.0)}) == A
    assert pick(2, {1: (2.0, 2.1), 2: (1.0, 1.1)}) == 2  # a thread split is picked by the same rule


def test_candidates_with_far_more_multiplies_than_the_cost_models_are_not_timed():
    t = dataclasses.replace(HOST, tuning=HOST.tuning.replace(winograd_widths=(128, 256, 512)))
    geom = (1, 64, 32, 32, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)  # ResNet-18's first 3x3 layers
    methods = lambda tt: [(c.method, c.mr if c.method == "winograd" else 0) for c in worth_timing(tt, geom)]  # noqa: E731
    assert methods(t) == [("winograd", 4), ("winograd", 2)]  # direct and im2col: 4x F(4x4)'s multiplies
    wide = t.tuning.replace(autotune_max_work=4.0)
    assert {"direct", "im2col"} <= {m for m, _ in methods(dataclasses.replace(t, tuning=wide))}
    every = methods(dataclasses.replace(t, tuning=t.tuning.replace(autotune_max_work=0.0)))
    assert {"direct", "im2col"} <= {m for m, _ in every}  # 0: none pruned
    strided = (1, 64, 32, 32, 128, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1)  # no Winograd: the same multiplies each
    assert len(worth_timing(t, strided)) >= 2


def test_cpu_identity_names_the_processor():
    ident = cpu_identity()
    assert ident and ident == cpu_identity()


@pytest.fixture(scope="module")
def cnn():
    pytest.importorskip("torch")
    from cuvil.compiler.frontends.torch import import_torch
    from cuvil.compiler.ir.infer import bind_batch
    from cuvil.compiler.passes.pipeline import optimize

    from tests.zoo import ZOO

    model, example = ZOO["small_cnn"]()
    graph = import_torch(model, example)
    return graph, bind_batch(optimize(graph), 1), {n: t.numpy() for n, t in zip(graph.inputs, example)}


def test_a_zero_budget_tunes_nothing(cnn):
    _, lowered_graph, _ = cnn
    t = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_budget_s=0.0))
    report = tune(lowered_graph, t)
    assert report.results == () and report.choices == {} and report.skipped >= 1


def test_a_graph_too_small_to_pay_for_two_builds_builds_nothing(cnn, monkeypatch):
    from cuvil.edge_runtime import autotune
    from cuvil.compiler.codegen.cpu.kernels.conv import tunable_convs

    _, lowered_graph, _ = cnn
    layers = len(tunable_convs(lowered_graph))
    assert layers >= 2

    def no_build(*args, **kwargs):
        raise AssertionError("a candidate was built")

    monkeypatch.setattr(autotune, "Candidate", no_build)
    small = HOST.tuning.replace(autotune_budget_s=60.0, autotune_fraction=1.9 / layers)
    report = tune(lowered_graph, dataclasses.replace(HOST, tuning=small))
    assert report.results == () and report.skipped >= 1 and report.budget_s == 0.0


def test_the_tuner_collects_its_candidates_garbage_inside_a_lowering_that_does_not(cnn, monkeypatch):
    """The lowering turns the cyclic collector off; each tuning candidate's llvmlite module is cyclic
    garbage once printed, so the tuner turns it on while it runs and off again after."""
    import gc

    from cuvil.edge_runtime import autotune

    _, lowered_graph, _ = cnn
    seen = []

    def fake_tune(graph, target, llvm=None, known=None):
        seen.append(gc.isenabled())
        return autotune.TuneReport((), 0, 0.0, 0.0)

    monkeypatch.setattr(autotune, "tune", fake_tune)
    was = gc.isenabled()
    gc.disable()
    try:
        autotune.Retarget()(lowered_graph, dataclasses.replace(HOST, threads=1))
        assert seen == [True] and not gc.isenabled()
    finally:
        if was:
            gc.enable()


def test_at_two_threads_the_tuner_measures_each_split_against_the_whole_layer(cnn):
    _, lowered_graph, _ = cnn
    split_all = HOST.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0, autotune_budget_s=60.0,
                                    autotune_fraction=100.0)
    report = tune(lowered_graph, dataclasses.replace(HOST, threads=2, tuning=split_all))
    measured = [r for r in report.results if r.parts_seconds]
    assert measured  # the small CNN's convs have channels for two parts of whole vectors
    for r in measured:
        timed = dict(r.parts_seconds)
        assert set(timed) == {1, 2} and r.default_parts == 2  # a split at one MAC per part is the cost model's
        assert r.parts == pick(2, timed)
    free_sync = tune(lowered_graph, dataclasses.replace(HOST, threads=2, tuning=split_all.replace(parallel_sync_us=1e6)))
    assert all(free_sync.parts[r.geometry] == 1 for r in free_sync.results if r.parts_seconds)  # a second per handoff: never split


def _one_conv(c: int, hw: int):
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    b = GraphBuilder("conv")
    x = b.input("x", TensorType.parse(f"f32[1,{c},{hw},{hw}]"))
    w = b.constant(np.random.default_rng(0).standard_normal((c, c, 3, 3)).astype(np.float32), "w")
    return b.build([b.add1("Conv", [x, w], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)])


def test_the_tuner_times_the_cost_models_split_and_adds_none():
    graph = _one_conv(64, 16)  # 64 output channels: four vectors at 512 bits, eight at 256
    macs = 64 * 16 * 16 * 64 * 9
    model_two = HOST.tuning.replace(parallel_sync_us=1.0, conv_macs_per_us=1.0, parallel_sync_ratio=macs / 2,
                                    autotune_budget_s=60.0, autotune_fraction=100.0)
    report = tune(graph, dataclasses.replace(HOST, threads=3, tuning=model_two))
    (r,) = report.results
    assert r.default_parts == 2 and set(dict(r.parts_seconds)) == {1, 2} and r.parts == pick(2, dict(r.parts_seconds))
    whole = tune(graph, dataclasses.replace(HOST, threads=3, tuning=model_two.replace(parallel_sync_ratio=macs * 2.0)))
    assert whole.results[0].parts_seconds == () and whole.parts == {}  # kept whole by the cost model: not timed


def test_a_layers_candidates_share_one_input_and_output_and_each_gets_its_scratch(monkeypatch):
    from cuvil.edge_runtime import autotune

    built, make = [], autotune.Candidate

    def recording(*args, **kwargs):
        built.append(make(*args, **kwargs))
        return built[-1]
    monkeypatch.setattr(autotune, "Candidate", recording)
    graph = _one_conv(32, 16)
    roomy = HOST.tuning.replace(autotune_budget_s=60.0, autotune_fraction=100.0, autotune_max_work=100.0)
    tune(graph, dataclasses.replace(HOST, threads=1, tuning=roomy))
    assert len(built) >= 2 and len({b.choice for b in built}) == len(built)
    x, y, bias = built[0].buffers[:3]
    assert all(b.buffers[0] is x and b.buffers[1] is y and b.buffers[2] is bias for b in built)
    assert len({b.scratch_bytes for b in built}) > 1  # im2col's panel against a direct conv's few bytes
    assert all(b.buffers[4].nbytes >= b.scratch_bytes + 64 for b in built)
    outputs = []
    for b in built:  # each candidate, in turn on the shared buffers, computes the same conv
        y.fill(np.nan)
        b.call()
        outputs.append(y.copy())
    for out in outputs[1:]:
        np.testing.assert_allclose(out, outputs[0], rtol=1e-4, atol=1e-4)


def test_a_layer_split_by_tile_rows_takes_its_share_of_the_whole_layers_time(monkeypatch):
    """64 channels at 32x32, Winograd: two parts of one block each, nothing built for them (the whole
    layer's code over half its blocks): half the whole's time, plus the handoff."""
    import time

    from cuvil.compiler.codegen.cpu.conv.choices import choice_of, timing_weights
    from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
    from cuvil.edge_runtime import autotune, candidates

    geom = (1, 64, 32, 32, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    target = dataclasses.replace(HOST, threads=2,
                                 tuning=HOST.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    choice = choice_of(conv_plan(target, *geom))
    assert choice.method == "winograd"
    built, emit = [], candidates.emit_choice

    def recording(*args):
        built.append(args[3])
        return emit(*args)
    monkeypatch.setattr(candidates, "emit_choice", recording)
    whole = autotune.Candidate(target, geom, choice, timing_weights(geom), time.perf_counter)
    whole.wait()
    parts, timed = autotune._split_seconds(target, geom, whole, time.perf_counter)
    assert parts == 2 and set(timed) == {1, 2} and built == [geom]  # only the whole layer was built
    sync = target.tuning.parallel_sync_us * 1e-6
    assert timed[2] == pytest.approx(tuple(t / 2 + sync for t in timed[1]))


class _Compiler:
    """Records what the tuner hands over, compiles it at once (a stand-in for the compile's stream)."""

    workers = 1

    def __init__(self):
        self.levels, self.objects, self.seconds = [], [], []

    def submit(self, level: int, text: str) -> int:
        self.levels.append(level)
        self.objects.append(jit.emit_object(text, HOST, jit=True, speed_level=level))
        self.seconds.append(0.0)
        return len(self.objects) - 1

    def result(self, i: int) -> bytes:
        return self.objects[i]


@pytest.mark.parametrize("workers, compiler, budget", [
    (1, True, 0.5 * 11 * 0.07),  # one LLVM worker: its 70 ms a kernel set the pace, the IR overlaps
    (2, True, 0.5 * 11 * 0.035),  # two: 35 ms a kernel, still above the IR's 30
    (4, True, 0.5 * 11 * 0.03),  # four: the IR sets the pace
    (1, False, 0.5 * 11 * 0.10),  # LLVM in turn with the IR: their sum
])
def test_the_budget_is_a_fraction_of_the_untuned_compile_with_its_ir_and_llvm_overlapping(workers, compiler, budget):
    from cuvil.edge_runtime.autotune import _budget

    llvm = type("Stream", (), {"workers": workers})() if compiler else None
    # (IR s, LLVM s) of the cost-model kernels built so far; without a compiler the IR's figure holds both
    stages = [(0.02, 0.06), (0.04, 0.08)] if compiler else [(0.08, 0.0), (0.12, 0.0)]
    half = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_fraction=0.5, autotune_budget_s=60.0))
    assert _budget(half, stages, 11, llvm) == pytest.approx(budget)
    capped = dataclasses.replace(half, tuning=half.tuning.replace(autotune_budget_s=0.1))
    assert _budget(capped, stages, 11, llvm) == pytest.approx(min(0.1, budget))


def test_each_candidates_llvm_work_goes_to_the_compiler_it_is_given():
    llvm = _Compiler()
    big = HOST.tuning.replace(autotune_budget_s=60.0, autotune_fraction=100.0)
    (r,) = tune(_one_conv(32, 16), dataclasses.replace(HOST, tuning=big), llvm=llvm).results
    assert len(r.seconds) >= 2 and len(llvm.objects) == len(r.seconds)  # every candidate timed came this way
    assert set(llvm.levels) == {LIGHT_LEVEL}  # as the model's conv kernels


def _fake_builds(events: list) -> type:
    """A stand-in for ``autotune.Candidate`` that logs ("built" | "wait", choice) to ``events``: 10 ms of IR here,
    100 ms of LLVM on the worker, 0.11 s a build; the tests' clock stands still."""

    class Fake:
        def __init__(self, target, geom, choice, *args, **kwargs):
            self.choice, self.call = choice, lambda: None
            events.append(("built", choice))

        def wait(self) -> float:
            events.append(("wait", self.choice))
            return 0.11

        def stages(self) -> tuple[float, float]:
            return 0.01, 0.1

    return Fake


def test_a_candidate_is_not_queued_when_the_llvm_work_before_it_would_end_past_the_budget(monkeypatch):
    """A layer's candidates are queued before the first is waited for, and one LLVM worker compiles them in
    turn: each may start only if the work queued ahead of it still ends within the budget (SqueezeNet's
    tuning spent 0.74 s of a 0.59 s budget when only the candidate's own build was counted)."""
    from cuvil.edge_runtime import autotune

    events = []
    monkeypatch.setattr(autotune, "Candidate", _fake_builds(events))
    graph = _one_conv(32, 16)
    (geom,) = tunable_convs(graph)
    tight = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_budget_s=0.35, autotune_fraction=100.0,
                                                                 autotune_max_work=0.0))  # every candidate a rival
    assert len(worth_timing(tight, geom)) >= 4
    tune(graph, tight, clock=lambda: 0.0, llvm=type("S", (), {"workers": 1})())
    assert sum(kind == "built" for kind, _ in events) == 3  # the default; then 0.11 + 0.1 and 0.11 + 0.2 fit in 0.35 s, 0.11 + 0.3 does not


def test_the_first_layers_first_rival_is_built_while_llvm_builds_its_default(monkeypatch):
    """The first layer's default is waited for, as it sets the budget, only once its first rival's IR is made
    and queued: that IR overlaps the default's LLVM work (ResNet-18: 35 and 49 ms of IR, 90 and 70 ms of
    LLVM, in turn before). The rivals after it wait for the budget."""
    from cuvil.edge_runtime import autotune

    events = []
    monkeypatch.setattr(autotune, "Candidate", _fake_builds(events))
    graph = _one_conv(32, 16)
    (geom,) = tunable_convs(graph)
    roomy = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_budget_s=60.0, autotune_fraction=100.0,
                                                                 autotune_max_work=0.0))
    cands = worth_timing(roomy, geom)
    assert len(cands) >= 3
    tune(graph, roomy, clock=lambda: 0.0, llvm=type("S", (), {"workers": 1})())
    assert events[:3] == [("built", cands[0]), ("built", cands[1]), ("wait", cands[0])]
    assert events[3] == ("built", cands[2])  # queued after the budget was known


def test_tuned_session_matches_untuned(cnn, tmp_path):
    graph, _, feeds = cnn
    plain = compile_graph(graph, use_cache=False, tune=False)
    tuned = compile_graph(graph, cache_dir=tmp_path, tune=True)
    again = compile_graph(graph, cache_dir=tmp_path, tune=True)
    assert plain.stats.tune_ms == 0 and tuned.stats.tune_ms > 0 and again.stats.cache_hit
    a, b = plain.run(feeds), tuned.run(feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-4)


def test_candidates_are_loaded_by_cuvils_loader_and_by_mcjit_only_when_it_refuses(monkeypatch):
    from cuvil.edge_runtime import linking
    from cuvil.edge_runtime.objload import UnsupportedObjectError

    big = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_budget_s=60.0, autotune_fraction=100.0))
    engines = []
    load_functions = jit.load_functions
    monkeypatch.setattr(jit, "load_functions", lambda *a: engines.append(a) or load_functions(*a))
    (r,) = tune(_one_conv(32, 16), big, llvm=_Compiler()).results
    assert len(r.seconds) >= 2 and engines == []  # no LLVM execution engine in this process

    def refuse(objects, names):
        raise UnsupportedObjectError("a relocation this loader does not implement")

    monkeypatch.setattr(linking, "load_image", refuse)
    (r,) = tune(_one_conv(32, 16), big, llvm=_Compiler()).results
    assert len(r.seconds) >= 2 and len(engines) == len(r.seconds)


def test_a_recorded_choice_is_taken_untimed_and_nothing_is_built(monkeypatch):
    from cuvil.edge_runtime import autotune

    graph = _one_conv(32, 16)
    big = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_budget_s=60.0, autotune_fraction=100.0))
    (geom, cands), = [(g, worth_timing(big, g)) for g in tunable_convs(graph)]
    assert len(cands) >= 2

    def no_build(*args, **kwargs):
        raise AssertionError("a candidate was built")

    monkeypatch.setattr(autotune, "Candidate", no_build)
    (r,) = tune(graph, big, known=Known({geom: cands[-1]})).results
    assert r.recorded and r.choice == cands[-1] and r.seconds == {}
    assert tune(graph, big, known=Known({geom: cands[-1]})).settled == {geom: cands[-1]}


def test_a_recorded_choice_that_is_not_a_candidate_is_timed_again():
    graph = _one_conv(32, 16)
    big = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_budget_s=60.0, autotune_fraction=100.0))
    (geom,) = tunable_convs(graph)
    (r,) = tune(graph, big, known=Known({geom: ConvChoice("nonsense", 99, 99, 3)})).results
    assert not r.recorded and len(r.seconds) >= 2 and r.choice in worth_timing(big, geom)


def _split_in_two():
    """A conv the cost model splits in two at 2 threads (a part is half its work), all of it timed:
    (graph, target, its geometry)."""
    graph = _one_conv(64, 16)
    macs = 64 * 16 * 16 * 64 * 9
    model_two = HOST.tuning.replace(parallel_sync_us=1.0, conv_macs_per_us=1.0, parallel_sync_ratio=macs / 2,
                                    autotune_budget_s=60.0, autotune_fraction=100.0)
    (geom,) = tunable_convs(graph)
    return graph, dataclasses.replace(HOST, threads=2, tuning=model_two), geom


def test_at_two_threads_only_a_recorded_layers_split_is_timed():
    graph, two, geom = _split_in_two()
    recorded = worth_timing(two, geom)[-1]
    report = tune(graph, two, known=Known({geom: recorded}, {(geom, 3): False}))  # a decision for 3 threads only
    (r,) = report.results
    assert r.recorded and r.choice == recorded and r.seconds == {} and set(dict(r.parts_seconds)) == {1, 2}
    assert report.split_decisions(2) == {(geom, 2): r.parts == 2}  # what the record will keep


def test_layers_the_budget_did_not_reach_are_settled_at_the_cost_models_choice(cnn):
    _, lowered_graph, _ = cnn
    t = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune_budget_s=0.0))
    report = tune(lowered_graph, t)
    layers = {g for g in tunable_convs(lowered_graph) if len(worth_timing(t, g)) > 1}
    assert report.settled == {g: worth_timing(t, g)[0] for g in layers} and len(report.untimed) == report.skipped


@pytest.mark.parametrize("keep", [True, False])
def test_a_recorded_split_decision_is_taken_and_nothing_is_built(keep, monkeypatch):
    from cuvil.edge_runtime import autotune

    graph, two, geom = _split_in_two()
    recorded = worth_timing(two, geom)[-1]

    def no_build(*args, **kwargs):
        raise AssertionError("a candidate was built")

    monkeypatch.setattr(autotune, "Candidate", no_build)
    report = tune(graph, two, known=Known({geom: recorded}, {(geom, 2): keep}))
    (r,) = report.results
    assert r.recorded and r.default_parts == 2 and r.parts == (2 if keep else 1) and r.parts_seconds == ()
    assert report.parts == ({} if keep else {geom: 1}) and report.split_decisions(2) == {}  # nothing new to record
