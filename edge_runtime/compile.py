"""compile_graph: Graph -> (cached artifact | lowered -> LLVM -> artifact) -> loaded code -> Session.

A cache hit reads code, packed weights and plan from one file and never lowers: lowering a large
model (packing weights, planning memory) costs hundreds of milliseconds of Python. The code
generator, the tuner and the LLVM helpers are imported on a miss only, so a warm device process
never loads them (~100 modules, ~7 MB).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable

import numpy as np

from ..compiler.codegen.cpu.threads import check_threads
from ..compiler.codegen.lowered import LoweredModel
from ..compiler.errors import CompileError
from ..compiler.ir.graph import Graph
from ..compiler.target import Target
from ..devices.detect import HostFacts, cpu_identity, llvm_host_facts, resolve_target
from . import heap, split_check
from .artifact import OpenedArtifact
from .cache import CompileCache, cache_key, graph_digest
from .host_memo import host_target
from .loader import Model
from .objload import LoadedCode, UnsupportedObjectError, load_object
from .plan_search import Builds, repacked, search
from .prelink import Prelinked, load_prelinked
from .session import CompileStats, Session, StepClock, new_arena
from .tuning_record import TuningRecord, scope as tuning_scope, structure_digest

log = logging.getLogger(__name__)


def resolve(target: str | Target, host: Target | None = None) -> Target:
    """``"host"`` (``host`` when given: detected already), a device profile name, or a Target as is."""
    if isinstance(target, Target):
        return target
    if target == "host":
        return host or resolve_target("host")
    return resolve_target(target)


def runnable_here(target: Target, host: Target | None = None) -> bool:
    """True when this process can execute code built for ``target`` (same ISA, features present);
    ``host``: this machine's Target when the caller has it (detection is once per call, not twice)."""
    host = host or resolve_target("host")
    if target.triple.split("-")[0] != host.triple.split("-")[0]:
        return False
    have = {f for f in host.features if f.startswith("+")}
    return all(f in have for f in target.features if f.startswith("+") and "prefer" not in f)


MAX_AUTO_JOBS = 4
HELPER_WORTHY_KERNELS = 8  # nodes whose kernel packs constant weights: lowering then outlasts a helper's start-up


def auto_jobs(graph: Graph) -> int:
    """Processes for LLVM: one per usable CPU (at most MAX_AUTO_JOBS) for a graph big enough to gain,
    counted on the graph the lowering takes, by its kernels that pack constant weights (the kernel
    table's packers: a fused or quantized conv as well as a Conv; by the op names Conv, Gemm and
    MatMul, ResNet-18's optimized graph of 17 FusedConv and 3 Conv got no helper, and llvmlite ran
    in the compiling process). A smaller graph gets one helper all the same unless this process has
    loaded LLVM's library already: loaded for it, it stays resident, and a device that compiled a
    small model before (its CPU's facts remembered, so no helper started to ask them) peaked at
    139-170 MiB where the helper's compile peaked at 55-63 and ONNX Runtime at 59-116 (TextCNN, the
    wide MLP, AlexNet, the 1-D audio CNN, 2026-12-05); the helper's start-up cost it 0-0.15 s."""
    from ..compiler.codegen.cpu.lowering import KERNELS
    from .parallel import workers

    heavy = sum(1 for n in graph.nodes if (k := KERNELS.get(n.op)) is not None and k.pack is not None
                and any(i in graph.constants for i in n.inputs))
    jobs = min(workers(), MAX_AUTO_JOBS) if heavy >= HELPER_WORTHY_KERNELS else 1
    return 2 if jobs == 1 and not llvm_loaded() else jobs


def llvm_loaded() -> bool:
    """Whether this process has loaded LLVM's library (llvmlite's binding) already."""
    return "llvmlite.binding" in sys.modules


def compile_graph(graph: Graph, target: str | Target = "host", batch: int = 1,
                  cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                  content_hash: str | None = None, optimize: bool = True, profile: bool = False,
                  jobs: int | None = None, guard_pages: bool = False, tune: bool | None = None,
                  threads: int | None = None) -> Session:
    """Compile ``graph`` natively for this machine at ``batch``; the whole artifact is cached on disk.

    ``content_hash`` (a bundle's hash) is the cache key's content, so a warm start hashes nothing
    large; by default the graph's canonical text and weights are hashed. ``optimize=False`` skips
    the graph passes (kernel tests use it); ``profile=True`` counts cycles per node
    (``Session.profile``). ``jobs``: processes sharing the LLVM work on a cache miss (1: this one
    only, with an LLVM thread; default: :func:`auto_jobs`); the helpers are spawned before lowering
    and compile each kernel as soon as it is lowered (:mod:`.stream`). ``guard_pages=True``: the
    session's arena and weights lie between inaccessible pages (:mod:`.guard`), so an access outside
    them faults (a testing mode: the weights are copied).
    ``tune=True``: time each conv layer's candidate kernels here and keep the fastest (:mod:`.autotune`),
    within the profile's budget; a tuned artifact is cached under this exact CPU. Default: the
    profile's ``tuning.autotune`` (on for a detected host), so a device tunes itself unasked.
    ``threads``: threads one inference runs on (default: the Target's own count); the session starts
    its workers once, and the answer is the same for any count.
    """
    return _compile(lambda: graph, target, batch, cache_dir, use_cache, content_hash, optimize, profile, jobs,
                    guard_pages, tune, threads)


def compile_model(model: Model, target: str | Target = "host", batch: int = 1,
                  cache_dir: str | os.PathLike | None = None, use_cache: bool = True, **options) -> Session:
    """:func:`compile_graph` of a verified Model, keyed by its content hash: on a cache hit its graph
    is never used, so a model loaded with ``load(..., lazy=True)`` never reads its weights (a warm
    start then neither hashes nor holds them). ``options``: those of :func:`compile_graph`."""
    return _compile(model.graph_once, target, batch, cache_dir, use_cache, model.content_hash, **options)


class _Spare:
    """On a miss of the remembered host facts (:mod:`.host_memo`), LLVM's facts about this CPU are
    asked of an LLVM helper process started for the purpose, which this compile then uses as a
    helper: asking llvmlite here would load its library into this process (~40 MiB of a cold
    compile's peak) for three answers. Only where this compile may use helpers (``jobs`` not 1,
    more than one CPU); the helper is stopped on leaving if no compile took it. While it starts,
    the graph is read and optimized (``optimize``: the pass pipeline needs no Target): ``graphs`` holds
    the result for the lowering to take."""

    def __init__(self, graph_of: Callable[[], Graph], batch: int, jobs: int | None, optimize: bool) -> None:
        self.graph_of, self.batch, self.jobs, self.optimize = graph_of, batch, jobs, optimize
        self.helpers = None
        self.graphs: list[Graph] = []

    def host_facts(self) -> HostFacts:
        from .parallel import Helpers, workers

        if (workers() if self.jobs is None else self.jobs) > 1:
            self.helpers = Helpers(1)
            facts = self.helpers.host_facts(self._prepare)
            if facts is not None:
                return facts
        return llvm_host_facts()

    def prepare(self) -> None:
        """Put the graph the lowering takes in ``graphs``, unless done while the helper told the facts. On a
        miss whose host facts were remembered (no helper asked them), the first helper starts here all the
        same where one will be used (``jobs`` above 1, or by default in a process without LLVM's library:
        :func:`auto_jobs`), so its start-up (~0.1 s: llvmlite's import) overlaps the pass pipeline, as when
        it asks the facts; else the first LLVM work waited for it (ResNet-18's cold compile with the facts
        remembered, 2 threads: 1.03-1.07 s against 0.96-1.08 without them)."""
        from .parallel import Helpers

        if self.graphs:
            return
        if self.helpers is None and (self.jobs > 1 if self.jobs is not None else not llvm_loaded()):
            self.helpers = Helpers(1)
        self._prepare()

    def _prepare(self) -> None:
        from ..compiler.codegen.driver import optimized

        self.graphs.append(optimized(self.graph_of(), self.batch) if self.optimize else self.graph_of())

    def __enter__(self) -> _Spare:
        return self

    def __exit__(self, *exc) -> None:
        if self.helpers is not None:
            self.helpers.close()


def _compile(graph_of: Callable[[], Graph], target: str | Target, batch: int, cache_dir, use_cache: bool,
             content_hash: str | None, optimize: bool = True, profile: bool = False, jobs: int | None = None,
             guard_pages: bool = False, tune: bool | None = None, threads: int | None = None) -> Session:
    with _Spare(graph_of, batch, jobs, optimize) as spare:
        session = _compile_spared(spare, graph_of, target, batch, cache_dir, use_cache, content_hash, optimize,
                                  profile, jobs, guard_pages, tune, threads)
    session.watch_workers()  # the check is done: from now on the session keeps the faster way itself
    session.collapse_weights_later()
    if not session.stats.cache_hit:
        heap.release()  # the process runs on at its steady size, not its compile's (ResNet-18: 140 -> 128 MiB)
    return session


def _compile_spared(spare: _Spare, graph_of: Callable[[], Graph], target: str | Target, batch: int, cache_dir,
                    use_cache: bool, content_hash: str | None, optimize: bool, profile: bool, jobs: int | None,
                    guard_pages: bool, tune: bool | None, threads: int | None) -> Session:
    t0, clock = time.perf_counter(), StepClock()
    cache = CompileCache(cache_dir) if use_cache else None
    request = f"{content_hash} {target!r} {batch} {optimize} {profile} {tune} {threads}" if content_hash else None
    early = cache.open_early(request) if cache and request else None  # the weights' check starts now
    clock.mark("open entry")
    host = host_target(cache, spare.host_facts) if cache else resolve_target("host")
    clock.mark("host facts")
    tgt = resolve(target, host)
    tune = tgt.tuning.autotune if tune is None else tune
    if threads is not None:
        tgt = dataclasses.replace(tgt, threads=threads)
    check_threads(tgt)
    if not runnable_here(tgt, host):
        raise CompileError(f"target {tgt.name!r} ({tgt.triple}, {tgt.cpu}) cannot run on this host; "
                           f"'cuvil compile --target {tgt.name} -o FILE' writes its object file, "
                           f"'cuvil run --device {tgt.name}' runs it emulated")
    tuned_on = f" tuned-on={cpu_identity()}" if tune else ""
    clock.mark("target")
    fingerprint = cache.fingerprint() if cache else None
    clock.mark("fingerprint")
    key = cache_key(f"{content_hash or graph_digest(graph_of())} optimize={optimize} profile={profile}{tuned_on}", tgt,
                    batch, fingerprint) if cache else ""
    art = cache.get(key, tgt, early) if cache else None
    clock.mark("key, entry parsed")
    confirm = False  # this compile re-takes a whole entry's decision: a second "whole" settles it
    as_loaded = False  # the entry is a split build kept with its workers off: checked again as it loads, not compiled
    if art is not None and tune and split_check.recheck(art.lowered.split_settled, cache.age_s(key), tgt.threads):
        as_loaded = bool(art.lowered.split_nodes and not art.lowered.workers)
        if not as_loaded:
            log.info("compiling again: the cores have room now for the split decision the entry left open (%s)",
                     art.lowered.split_reason)
            cache.weights(key, art)  # its check's thread ends before the new check times anything
            confirm, art = art.lowered.split_nodes == 0, None
    t1 = time.perf_counter()
    if art is not None:
        if request and (early is None or early.key != key):
            cache.remember(request, key)
        code = load_code(art.objects, art.lowered.entry, tgt, art.image)
        t2 = time.perf_counter()
        clock.mark("code load")
        arena = None if guard_pages else new_arena(art.lowered)  # still while the weights' check runs
        clock.mark("arena")
        weights = cache.weights(key, art)  # checked while the code loaded; nothing read them before
        clock.mark("weights' check")
        if weights is not None:
            stats = CompileStats(lower_ms=0.0, llvm_ms=0.0, load_ms=(t2 - t1) * 1e3, cache_hit=True,
                                 kernel_count=art.lowered.kernel_count, node_count=art.lowered.node_count,
                                 object_bytes=sum(map(len, art.objects)), cache_ms=(t1 - t0) * 1e3)
            session = Session(art.lowered, code, stats, weights=weights, guard_pages=guard_pages, arena=arena)
            clock.mark("session")
            session.stats = dataclasses.replace(stats, steps=clock.steps())
            if as_loaded:
                _check_kept(session, cache, key, art, weights, request)
            return session
    from . import autotune
    from .stream import Reuse

    record = TuningRecord(cache.dir, cache.sealer, tuning_scope(tgt, fingerprint)) if tune and cache and cache.sealer \
        else None
    spare.prepare()  # while the first helper starts
    graphs = spare.graphs  # the lowering takes it over
    jobs = auto_jobs(graphs[0]) if jobs is None else jobs  # once: a rebuilt plan takes as many
    structure = structure_digest(graphs[0], batch, f"optimize={optimize} profile={profile}") \
        if record and tgt.threads > 1 else None
    tuner = autotune.Retarget(record=record, structure=structure) if tune else None
    reuse = Reuse()  # a plan built again compiles only the modules it changed
    lowered, objs, lower_s = _build(graphs, tgt, batch, False, profile, jobs, tuner, spare.helpers, reuse)
    builds = Builds(lowered, objs, lower_s, time.perf_counter() - t1 - lower_s,  # LLVM: what is left after lowering
                    build=lambda plan: _build([graph_of()], tgt, batch, optimize, profile, jobs, lambda g, t: plan,
                                              reuse=reuse),
                    repack=lambda plan, before: repacked(before, graph_of(), tgt, plan, batch, optimize, profile),
                    load=lambda lw, objs: Session(lw, load_code(objs, lw.entry, tgt), None, guard_pages=guard_pages))
    settled = tuner.settled if tuner else None
    plans = split_check.plans(lowered.target) if tuner and lowered.split_nodes and settled is None else ()
    del lowered, objs  # the builds' own from here: a rebuild lets them go
    if settled is not None:
        verdict, plan_index, kept = split_check.Verdict(
            bool(builds.lowered.split_nodes), True, "as this CPU's tuning record settled it for this model's "
            f"structure (plan {settled[0]}, handoff {settled[1]:g} us)"), 0, False
    else:
        verdict, plan_index, kept = search(builds, plans, confirm, bool(tuner and tuner.cheaper_differs), tgt.threads)
    if verdict is not None and verdict.settled and settled is None and structure and tuner.report:
        record.settle(structure, tgt.threads, plan_index, tuner.report.sync_us or tgt.tuning.parallel_sync_us)
    lowered, objs, session = builds.lowered, builds.objs, builds.session
    if verdict is not None:
        decided = dict(split_settled=verdict.settled, split_reason=verdict.reason, workers=not kept)
        lowered = dataclasses.replace(lowered, **decided)
        session.lowered = dataclasses.replace(session.lowered, **decided)
    if cache:
        cache.put_behind(key, lowered, objs, request)
    t4 = time.perf_counter()
    lower_s, llvm_s = builds.lower_s, builds.llvm_s
    session.stats = CompileStats(lower_ms=lower_s * 1e3, llvm_ms=llvm_s * 1e3, load_ms=(t4 - t1 - lower_s - llvm_s) * 1e3,
                                 cache_hit=False, kernel_count=lowered.kernel_count, node_count=lowered.node_count,
                                 object_bytes=sum(map(len, objs)), cache_ms=(t1 - t0) * 1e3,
                                 tune_ms=tuner.report.spent_s * 1e3 if tuner and tuner.report else 0.0,
                                 tuned_layers=len(tuner.report.choices) if tuner and tuner.report else 0,
                                 builds=builds.count)
    return session


def _check_kept(session: Session, cache: CompileCache, key: str, art: OpenedArtifact, weights: np.ndarray,
                request: str | None) -> None:
    """The whole-model check taken again on a kept split build (:func:`.split_check.keeps_built`), as loaded:
    nothing compiled, where an entry built whole is compiled again to be checked. A settled verdict goes to
    the entry (the split with its workers on, or settled "whole" with them off: the same code and bits
    either way); an unsettled one leaves the entry as it is, its age restarted (:func:`.split_check.recheck`:
    at most one check a minute)."""
    verdict = split_check.check(session, confirm=True)
    log.info("the kept split build checked again: %s", verdict.reason)
    if verdict.settled:
        decided = dict(split_settled=True, split_reason=f"{verdict.reason} (checked again on a warm start)",
                       workers=verdict.split)
        session.lowered = dataclasses.replace(session.lowered, **decided)
        cache.put_behind(key, dataclasses.replace(art.lowered, weights=weights, **decided), list(art.objects), request)
    else:
        cache.touch(key)
    session.set_workers(session.lowered.workers)


def _build(graphs: list[Graph], tgt: Target, batch: int, optimize: bool, profile: bool, jobs: int,
           retarget, started=None, reuse=None) -> tuple[LoweredModel, list[bytes], float]:
    """Lower the graph in ``graphs`` (taken out: the lowering frees each weight once packed, and a
    graph nobody else holds is gone before LLVM adds its own peak; ``retarget``: the tuner, or a
    fixed Target) and compile its objects; the seconds spent lowering (LLVM overlaps it: the rest of
    the time is LLVM's). ``jobs``: processes for LLVM, this one counted; ``started``: helpers started
    already (:class:`_Spare`), used too; ``reuse``: the objects of this compile's builds before
    (:class:`.stream.Reuse`), which this one adds to."""
    from ..compiler.codegen.lower import lower
    from .autotune import Retarget
    from .parallel import Helpers
    from .stream import KernelStream

    t0 = time.perf_counter()
    with Helpers(jobs - 1, adopt=started) as helpers, \
            KernelStream(tgt, helpers, reuse) as stream:
        if isinstance(retarget, Retarget):
            retarget.llvm = stream  # LLVM compiles each finished kernel while the rest is lowered
        lowered = lower(graphs.pop(), tgt, batch, optimize=optimize, profile=profile, retarget=retarget, stream=stream)
        lower_s = time.perf_counter() - t0
        objs = stream.finish()
    heap.release()  # what lowering freed, before the session's arena (ASPP's 8 MiB) comes on top of it
    return lowered, objs, lower_s


def load_code(objects: list[bytes], entry: str, target: Target, image: Prelinked | None = None) -> LoadedCode:
    """The model's code: ``image`` (the objects as a cache entry keeps them prelinked) copied and
    completed, else the objects linked with Cuvil's own loader (no llvmlite: a warm start neither
    imports nor maps it); with llvmlite's MCJIT where that loader meets something it does not implement."""
    if image is not None:
        try:
            return load_prelinked(image, entry, amx=target.has("amx-tile"))
        except UnsupportedObjectError:
            pass  # a symbol this process lacks: the objects are linked below, which says what is missing
    try:
        return load_object(objects, entry, amx=target.has("amx-tile"))
    except UnsupportedObjectError:
        from . import jit

        return jit.load_object(objects, entry, target)


def lower_for(graph: Graph, target: str | Target, batch: int = 1) -> LoweredModel:
    from ..compiler.codegen.lower import lower

    return lower(graph, resolve(target), batch)
