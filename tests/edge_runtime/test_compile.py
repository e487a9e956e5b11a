"""The compile entry point's care for the device process: what a cold compile leaves behind."""

import ctypes

import numpy as np
import pytest

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types
from cuvil.edge_runtime import compile as compile_mod


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(getattr(ctypes.CDLL(None), "malloc_trim", None) is None,
                    reason="malloc_trim is glibc's; with another C library the call is a no-op")
def test_freed_heap_pages_go_back_to_the_system():
    held = [b"x" * 65536 for _ in range(2000)]  # 125 MiB of heap chunks (below the mmap threshold), touched
    pinned = held[::8]  # every eighth stays: the heap cannot shrink from its top
    del held
    before = _rss_mib()
    compile_mod._release_freed_memory()
    after = _rss_mib()
    assert before - after > 60, (before, after)
    assert len(pinned) == 250


def test_only_a_cache_miss_trims(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(compile_mod, "_release_freed_memory", lambda: calls.append(1))
    rng = np.random.default_rng(0)
    graph = infer_graph_types("g", {"x": TensorType(DType.F32, (N, 8))}, {"w": rng.standard_normal((8, 4)).astype(np.float32)},
                              [Node.make("MatMul", ["x", "w"], ["y"])], ["y"])
    first = compile_mod.compile_graph(graph, cache_dir=tmp_path, tune=False)
    second = compile_mod.compile_graph(graph, cache_dir=tmp_path, tune=False)
    assert (first.stats.cache_hit, second.stats.cache_hit) == (False, True)
    assert calls == [1]
