"""Native execution in the public API: compile for this machine, run, and benchmark.

Kept apart from :mod:`cuvil.api` (import, export, load) so that module stays about bundles.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from .compiler.errors import CuvilError
from .compiler.interpreter import bind_types
from .compiler.ir.graph import Graph
from .compiler.ir.limits import check_graph
from .compiler.ir.types import Batch
from .devices import DeviceProfile, host_profile, list_profiles, load_profile, resolve_profile
from .edge_runtime.compile import compile_graph, compile_model
from .edge_runtime.latency import LatencyReport, measure
from .edge_runtime.loader import Model
from .edge_runtime.session import Session

PathLike = str | os.PathLike


def default_threads(target: str = "host") -> int:
    """The thread count a compile for ``target`` uses unless told: its cores, capped by the tuning."""
    return resolve_profile(target).default_threads


def compile(model: Graph | Model, target: str = "host", batch: int = 1,  # noqa: A001 (the API's verb)
            cache_dir: PathLike | None = None, guard_pages: bool = False, threads: int | None = None) -> Session:
    """Compile a Graph or a verified Model to native code for this machine (cached on disk).

    ``guard_pages=True`` puts the session's arena and weights between inaccessible pages, so code that
    reads or writes outside them faults at once (for testing; the weights are then copied, not mapped).
    ``threads``: threads one inference runs on (default: :func:`default_threads`); outputs are the same
    bits for any count. A cold compile hands over its session first and writes the cache entry on a
    thread of its own; the process finishes it before exiting, and ``cuvil.finish_writes()`` waits for
    it (before the cache directory is deleted or another process is to find the entry).
    """
    if threads is None:
        threads = default_threads(target)
    if isinstance(model, Model):  # keyed by its hash: a lazily loaded model's cache hit reads no weights
        return compile_model(model, target, batch, cache_dir, guard_pages=guard_pages, threads=threads)
    return compile_graph(model, target, batch=batch, cache_dir=cache_dir, guard_pages=guard_pages, threads=threads)


def check_batch(graph: Graph, batch: int) -> None:
    """CuvilError where ``batch`` is not 1 and no input of ``graph`` has a batch dimension: it would be
    ignored (``cuvil bench --batch 4`` timed batch 1 and printed "batch 4")."""
    if batch != 1 and not any(isinstance(d, Batch) for i in graph.inputs for d in graph.types[i].shape):
        raise CuvilError(f"the model's batch is fixed (no input has a batch dimension): a batch of {batch} "
                         f"applies only to a model imported with a symbolic batch")


def run_native(model: Graph | Model, inputs: Mapping[str, np.ndarray], cache_dir: PathLike | None = None,
               threads: int | None = None) -> dict[str, np.ndarray]:
    """Compile for the batch size the inputs carry, then run once natively."""
    types = model.input_types() if isinstance(model, Model) else model.input_types
    _, batch = bind_types(types, inputs)
    return compile(model, "host", batch or 1, cache_dir, threads=threads).run(inputs)


@dataclass(frozen=True)
class BenchResult:
    latency: LatencyReport
    cold_compile_s: float
    warm_start_ms: float
    arena_bytes: int
    lower_bound_bytes: int
    kernels: int
    threads: int = 1  # the latency is for this many threads

    def as_dict(self) -> dict:
        out = asdict(self)
        out["latency"] = {k: v for k, v in out["latency"].items() if k != "histogram"}
        return out


def synthetic_inputs(graph: Graph, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs of the graph's types: latency on them carries no private information."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        t = graph.types[name]
        shape = tuple(d.bind(batch) if isinstance(d, Batch) else d for d in t.shape)
        out[name] = (rng.standard_normal(shape) if t.dtype.is_float else rng.integers(0, 2, shape)).astype(t.dtype.numpy)
    return out


def bench(model: Graph | Model, runs: int = 200, warmup: int = 20, batch: int = 1,
          threads: int | None = None) -> BenchResult:
    """Cold compile (empty cache), warm start (cache hit to first result), then latency after warm-up."""
    threads = default_threads() if threads is None else threads
    graph = model.graph if isinstance(model, Model) else model
    check_batch(graph, batch)
    check_graph(graph, batch)  # before the synthetic inputs, which are as large as the batch asks
    feeds = synthetic_inputs(graph, batch)
    with tempfile.TemporaryDirectory(prefix="cuvil-bench-") as cache:
        t0 = time.perf_counter()
        compile(model, "host", batch, cache, threads=threads).run(feeds)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        session = compile(model, "host", batch, cache, threads=threads)
        session.run(feeds)
        warm_ms = (time.perf_counter() - t0) * 1e3
    plan = session.memory_plan
    report = measure(lambda: session.run(feeds), warmup=warmup, runs=runs)
    return BenchResult(report, cold, warm_ms, plan.arena_bytes, plan.lower_bound, session.stats.kernel_count,
                       session.threads)


def device_profiles() -> list[DeviceProfile]:
    """Every shipped device profile, then this machine's own (named ``host``)."""
    return [load_profile(name) for name in list_profiles()] + [host_profile()]
