"""On-device autotuning: time each distinct conv layer's candidate kernels on this CPU, keep the fastest.

The cost model picks a method and register tile per conv from a profile's numbers; a device can do
better by measuring itself. For every distinct conv geometry of the (optimized) graph, largest
first, the candidates (``conv_candidates``: the cost model's choice first) are built into one
module, each packed with its own weights (a compile hands each candidate's LLVM work to its
:class:`.stream.KernelStream`, so an idle core does it while the next candidate's IR is built), and
timed in ``candidates.ROUNDS`` interleaved rounds on random inputs. A candidate replaces the cost model's choice only when its fastest round is at least
``MARGIN`` faster than the choice's fastest and it was faster in every round (a round times all
candidates back to back, so a burst of other work hits them alike; one a burst favoured once does
not win): tuning never trades a measured tie or a noisy lead for an untested kernel. Ties go to
the earlier candidate. Candidates that do more than ``Tuning.autotune_max_work`` times the cost model's
choice's multiplies are not built at all (:func:`worth_timing`): they never won where timed, and
building them was most of the tuning time. The choice is therefore a pure function of the
measurements and the profile.

At more than one thread, in a model with convs, the pool's handoff is measured first
(:mod:`.pool_probe`) and becomes the target's ``Tuning.parallel_sync_us``, so the cost model splits
only layers worth that handoff here (a model without convs keeps the profile's: its small GEMMs split
at a measured handoff lost, docs/threads.md);
then each tuned layer that the cost model splits is measured too: the slowest part (the chosen kernel over its output-channel range) plus ``Tuning.parallel_sync_us`` against the
whole layer; the whole layer replaces the split only when it is ``MARGIN`` faster.
A part is timed alone, on one core: what two parts contend for (memory bandwidth, a busy CPU) is
not measured, so a split is only as good as the machine's second core is free.

The time spent is bounded by the profile's ``[tuning]``: at most ``autotune_fraction`` of an
estimate of the untuned compile and never more than ``autotune_budget_s`` (see :func:`tune`). Layers left when the budget runs out keep the cost
model's choice. The result is cached with the compiled artifact, keyed by the exact CPU, and every
layer's choice goes to the CPU's tuning record (:mod:`.tuning_record`), which later compiles take untimed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ..compiler.codegen.cpu.conv.choices import conv_candidates, multiplies, timing_weights, with_choices
from ..compiler.codegen.cpu.jobs import job_layout
from ..compiler.codegen.cpu.kernels.conv import tunable_convs
from ..compiler.codegen.cpu.kernels.split import split_ranges
from ..compiler.codegen.lower import cycle_collection
from ..compiler.ir.graph import Graph
from ..compiler.target import ConvChoice, Geometry, Target
from . import heap, pool_probe, split_check
from .candidates import Buffers, Candidate, Compiler, interleaved_seconds
from .tuning_record import Known, TuningRecord

MARGIN = 0.10  # a candidate must beat the cost model's choice by this fraction to replace it
K = TypeVar("K")


@dataclass(frozen=True)
class LayerResult:
    geometry: Geometry
    choice: ConvChoice
    default: ConvChoice
    seconds: dict[ConvChoice, tuple[float, ...]]  # seconds per call of each candidate timed, per round
    parts: int = 1  # threads sharing the layer: the tuner's pick (one: whole)
    default_parts: int = 1  # the cost model's
    parts_seconds: tuple[tuple[int, tuple[float, ...]], ...] = ()  # (parts, predicted seconds per round) when the split was measured
    recorded: bool = False  # the choice came from the tuning record, untimed


@dataclass(frozen=True)
class TuneReport:
    results: tuple[LayerResult, ...]
    skipped: int  # tunable layers left at the cost model's choice when the budget ran out
    spent_s: float
    budget_s: float
    sync_us: float | None = None  # the pool's handoff measured here (more than one thread), in the tuned Target
    untimed: tuple[tuple[Geometry, ConvChoice], ...] = ()  # the layers skipped, with the cost model's choice

    @property
    def settled(self) -> dict[Geometry, ConvChoice]:
        """Every tunable layer's choice, timed, recorded or the cost model's: what the tuning record keeps."""
        return {r.geometry: r.choice for r in self.results} | dict(self.untimed)

    def split_decisions(self, threads: int) -> dict[tuple[Geometry, int], bool]:
        """Each split measured here: whether it pays at ``threads``, as the tuning record keeps it."""
        return {(r.geometry, threads): r.parts > 1 for r in self.results if r.parts_seconds}

    @property
    def choices(self) -> dict[Geometry, ConvChoice]:
        return {r.geometry: r.choice for r in self.results if r.choice != r.default}

    @property
    def parts(self) -> dict[Geometry, int]:
        return {r.geometry: r.parts for r in self.results if r.parts != r.default_parts}


def pick(default: K, rounds: Mapping[K, Sequence[float]], margin: float = MARGIN) -> K:
    """The candidate with the fastest round among those whose fastest round beats ``default``'s by
    ``margin`` and that were faster than ``default`` in every round; else ``default`` (ties: first)."""
    base = rounds[default]
    wins = [c for c, ts in rounds.items() if min(ts) < (1 - margin) * min(base) and all(map(operator.lt, ts, base))]
    return min(wins, key=lambda c: min(rounds[c])) if wins else default  # min keeps the first of equal keys


def tune(graph: Graph, target: Target, clock: Callable[[], float] = time.perf_counter,
         llvm: Compiler | None = None, known: Known | None = None) -> TuneReport:
    """Measure the candidates of ``graph``'s conv layers (already optimized and batch-bound).

    ``known``: what this CPU's tuning record holds (:mod:`.tuning_record`); a layer whose recorded
    choice is one of its candidates takes it untimed, and at more than one thread only its split is
    measured, unless the record says too whether that split pays at this thread count.
    Budget: the untuned compile is estimated from the cost-model kernels built so far, one per
    distinct conv layer (they dominate lowering and LLVM), their IR and LLVM work overlapping as in
    the compile (:func:`_budget`); no kernel is built once the time spent plus the mean build (and the
    LLVM work of the layer's candidates queued ahead of it) would pass ``autotune_fraction`` of the
    estimate or ``autotune_budget_s``. Largest layers first; the
    rest keep the cost model's choice. A graph whose budget cannot pay for two builds
    (``autotune_fraction`` x layers < 2) is not tuned at all.
    ``llvm``: where the candidates' LLVM work goes (default: here, in turn); a layer's candidates are
    all queued before the first is waited for, so their IR and their LLVM work overlap."""
    t0 = clock()
    layers = [(g, c) for g, _ in sorted(tunable_convs(graph).items(), key=lambda kv: -kv[1])
              if len(c := worth_timing(target, g)) > 1]
    known = known if known is not None else Known()
    fixed = {g: known.choices[g] for g, c in layers if known.choices.get(g) in c}
    done = {g: _recorded(target, g, fixed[g], c[0], known.splits.get((g, target.threads))) for g, c in layers if g in fixed}
    todo = [(g, (fixed[g],) if g in fixed else c) for g, c in layers
            if g not in fixed or ((g, target.threads) not in known.splits and _may_split(target, g, fixed[g]))]
    mean_build, budget, workers = 0.0, target.tuning.autotune_budget_s, llvm.workers if llvm is not None else 1
    if budget <= 0 or target.tuning.autotune_fraction * len(layers) < 2:
        # the budget could not pay for the first layer's default and one rival: build nothing (a small
        # graph's compile would otherwise pay for a default kernel built only to be thrown away)
        return _report(layers, done, clock() - t0, 0.0)
    for i, (geom, cands) in enumerate(todo):
        if i and clock() - t0 + 2 * mean_build > budget:
            break
        built = whole = None  # the last layer's candidates and buffers go before this one's are made
        weights, io = timing_weights(geom), Buffers(geom)  # made once for all of the layer's candidates
        built = [Candidate(target, geom, cands[0], weights, clock, llvm, io)]
        if not i:  # the first layer's default sets the budget: its first rival's IR is made while LLVM builds it
            built += [Candidate(target, geom, c, weights, clock, llvm, io) for c in cands[1:2]]
            mean_build = built[0].wait()
            stages = [built[0].stages()]
            budget = _budget(target, stages, len(layers), llvm)
        for c in cands[len(built):]:  # the LLVM work queued before this one's is done first, one build per worker at a time
            if clock() - t0 + mean_build + len(built) * _mean_llvm(stages) / workers > budget:
                break
            built.append(Candidate(target, geom, c, weights, clock, llvm, io))
        build_s = [b.wait() for b in built]
        if i:
            mean_build = (mean_build * i + build_s[0]) / (i + 1)
            stages.append(built[0].stages())
            budget = _budget(target, stages, len(layers), llvm)
        if len(built) < 2 and geom not in fixed:
            break
        seconds = interleaved_seconds({b.choice: b.call for b in built}) if len(built) > 1 else {}
        choice = pick(cands[0], seconds) if seconds else cands[0]
        whole = next(b for b in built if b.choice == choice)
        split = _split_seconds(target, geom, whole, clock, llvm) if clock() - t0 + mean_build <= budget else None
        result = done.get(geom) or LayerResult(geom, choice, cands[0], seconds)
        if split is not None:
            default_parts, timed = split
            result = dataclasses.replace(result, parts=pick(default_parts, timed), default_parts=default_parts,
                                         parts_seconds=tuple(timed.items()))
        done[geom] = result
    return _report(layers, done, clock() - t0, budget)


def _mean_llvm(stages: list[tuple[float, float]]) -> float:
    """The LLVM seconds of a candidate built so far, on average (0 without a compiler: then it is in the IR's)."""
    return float(np.mean([st[1] for st in stages]))


def _report(layers: list[tuple[Geometry, tuple[ConvChoice, ...]]], done: dict[Geometry, LayerResult],
            spent_s: float, budget_s: float) -> TuneReport:
    """The report of ``done``, in the order of ``layers``; those not done keep the cost model's choice."""
    untimed = tuple((g, c[0]) for g, c in layers if g not in done)
    return TuneReport(tuple(done[g] for g, _ in layers if g in done), len(untimed), spent_s, budget_s, untimed=untimed)


def _recorded(target: Target, geom: Geometry, choice: ConvChoice, default: ConvChoice, keep: bool | None) -> LayerResult:
    """A layer the record fixes: its choice, and where the record says whether the cost model's split
    of it pays at this thread count, that (``keep``; None: not recorded, to be measured)."""
    result = LayerResult(geom, choice, default, {}, recorded=True)
    ranges = split_ranges(with_choices(target, {geom: choice}), geom) if keep is not None else None
    return result if ranges is None else dataclasses.replace(result, parts=len(ranges) if keep else 1,
                                                              default_parts=len(ranges))


def _may_split(target: Target, geom: Geometry, choice: ConvChoice) -> bool:
    """True when the cost model splits ``geom`` at ``choice`` over the target's threads."""
    return target.threads > 1 and split_ranges(with_choices(target, {geom: choice}), geom) is not None


def _budget(target: Target, stages: list[tuple[float, float]], layers: int, llvm: Compiler | None) -> float:
    """Seconds tuning may spend: ``autotune_fraction`` of the untuned compile, estimated from the
    cost-model kernels built so far (``stages``: each one's IR and LLVM seconds) as ``layers`` kernels
    whose IR (this process) and LLVM work (its workers) overlap, as they do in the compile; at most
    ``autotune_budget_s``. Their sum, as if done in turn, made ResNet-18's untuned compile look 1.9x
    as long as it is (1.38 against 0.73 s), and tuning added 75-86% to it."""
    emit, llvm_s = (float(np.mean([st[k] for st in stages])) for k in (0, 1))
    untuned = layers * max(emit, llvm_s / (llvm.workers if llvm is not None else 1))  # no compiler: LLVM is in emit
    return min(target.tuning.autotune_budget_s, target.tuning.autotune_fraction * untuned)


def worth_timing(target: Target, geom: Geometry) -> tuple[ConvChoice, ...]:
    """``conv_candidates`` less those the cost model separates clearly: more than ``autotune_max_work``
    times the multiplies of its choice (the first). A layer left with one is not tuned at all."""
    cands, most = conv_candidates(target, geom), target.tuning.autotune_max_work
    if not most:
        return cands
    work = most * multiplies(target, geom, cands[0])
    return cands[:1] + tuple(c for c in cands[1:] if multiplies(target, geom, c) <= work)


def _split_seconds(target: Target, geom: Geometry, whole: Candidate, clock,
                   llvm: Compiler | None = None) -> tuple[int, dict[int, tuple[float, ...]]] | None:
    """(the cost model's parts, {1: the whole layer's seconds, parts: the split's predicted seconds}, per round), or
    None when the cost model keeps this layer whole: the tuner may undo a split, never add one, since a
    part timed alone does not see a busy second core (on a loaded 2-core host, MobileNetV2 tuned to 9 split
    layers, where the cost model splits 3, ran 1.16x slower than at one thread). ``llvm``: as :func:`tune`'s.
    A part of tile rows is not built: it runs the whole layer's code over its share of the blocks, and takes
    that share of the whole's time (ResNet-18's 64-channel 32x32 conv: 98 against 196 us when it was built
    and timed, 87 ms of a 2-thread cold compile)."""
    fixed = with_choices(target, {geom: whole.choice})
    ranges = split_ranges(fixed, geom)
    if ranges is None:
        return None
    largest = max(ranges, key=lambda r: (r.rows[1] - r.rows[0], r.blocks[1] - r.blocks[0] if r.blocks else 0))
    if largest.blocks is not None:  # the whole layer's code over its share of the blocks: that share of its time
        timed = interleaved_seconds({1: whole.call})
        share = (largest.blocks[1] - largest.blocks[0]) / ranges[-1].blocks[1]
        timed[len(ranges)] = tuple(t * share for t in timed[1])
    else:
        part = Candidate(largest.target, largest.geometry, whole.choice, timing_weights(largest.geometry), clock, llvm)
        part.wait()  # held: its code and buffers live while timed
        timed = interleaved_seconds({1: whole.call, len(ranges): part.call})
    timed[len(ranges)] = tuple(t + fixed.tuning.parallel_sync_us * 1e-6 for t in timed[len(ranges)])
    return len(ranges), timed


class Retarget:
    """``lower``'s retarget hook: tunes the optimized graph, keeps the report, returns the tuned Target.
    ``llvm``: where the candidates' LLVM work goes (default: done here, in turn); ``record``: this
    CPU's tuning record, whose choices are taken and which keeps this compile's (none: time all);
    ``structure``: the graph's :func:`.tuning_record.structure_digest`, whose recorded verdict at this
    thread count (``settled``: plan index, handoff us) fixes the handoff, unmeasured, and the plan built.
    ``cheaper_differs``: the handoff was measured dearer than the cheapest and the split at the cheapest
    (:func:`.split_check.generous`) would make other jobs, so it is worth building and checking too."""

    def __init__(self, llvm: Compiler | None = None, record: TuningRecord | None = None,
                 structure: str | None = None) -> None:
        self.report: TuneReport | None = None
        self.settled: tuple[int, float] | None = None
        self.cheaper_differs = False
        self.llvm, self.record, self.structure = llvm, record, structure

    def __call__(self, graph: Graph, target: Target) -> Target:
        # the lowering turns the collector off; the candidates' modules are cyclic garbage once printed, and
        # kept to its end they made tuning ResNet-50's cold peak: 355-356 MiB, 349 collected (a full
        # collection per layer gave 316 at 125-145 ms of compile time: not taken)
        with cycle_collection(on=True):
            tuned = self._retarget(graph, target)
        heap.release()  # the candidates' garbage before the weights are packed (with _build's: U-Net 68 -> 62 MiB)
        return tuned

    def _retarget(self, graph: Graph, target: Target) -> Target:
        sync_us, probe_s, convs = None, 0.0, tunable_convs(graph)
        verdict = self.structure if target.threads > 1 else None
        with self.record.held() if self.record and (convs or verdict) else contextlib.nullcontext(Known()) as known:
            self.settled = known.verdicts.get((verdict, target.threads)) if verdict else None
            if target.threads > 1 and convs:  # what a split costs here decides which layers split
                t0 = time.perf_counter()
                sync_us = self.settled[1] if self.settled else pool_probe.handoff_us(target, self.llvm)
                probe_s = time.perf_counter() - t0
                target = dataclasses.replace(target, tuning=target.tuning.replace(parallel_sync_us=sync_us))
            report = tune(graph, target, llvm=self.llvm, known=known)
            known.choices.update(report.settled)
            known.splits.update(report.split_decisions(target.threads))
            known.splits.update({(g, target.threads): True for g, c in report.settled.items()  # the cost model's, unmeasured
                                 if (g, target.threads) not in known.splits and _may_split(target, g, c)})
        self.report = dataclasses.replace(report, spent_s=report.spent_s + probe_s, sync_us=sync_us)
        tuned = with_choices(target, self.report.choices)
        tuned = dataclasses.replace(tuned, conv_parts=tuple(sorted(self.report.parts.items(), key=repr)))
        if self.settled is None:
            self.cheaper_differs = sync_us is not None and sync_us > pool_probe.FLOOR_US and \
                job_layout(graph, tuned) != job_layout(graph, split_check.generous(tuned))
            return tuned
        plans = split_check.plans(tuned)
        return plans[min(self.settled[0], len(plans) - 1)]
