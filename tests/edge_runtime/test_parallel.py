"""Parallel cold compiles: the spawned LLVM helpers, their protocol, and falling back without them."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.codegen.driver import optimized
from cuvil.devices import detect
from cuvil.edge_runtime import llvm_worker, parallel, stream
from cuvil.edge_runtime.compile import auto_jobs, compile_graph, resolve
from cuvil.edge_runtime.levels import LIGHT_LEVEL
from cuvil.edge_runtime.llvm_worker import target_from_json, target_to_json


def _conv_graph(convs: int = 4, seed: int = 0, channels: int = 16, size: int = 12):
    """Same-shape 3x3 convs (one shared Winograd stage helper at 256 bits) and a Gemm head."""
    rng = np.random.default_rng(seed)
    gb = GraphBuilder("convs")
    h = gb.input("x", TensorType(DType.F32, (1, channels, size, size)))
    for i in range(convs):
        w = gb.constant((rng.standard_normal((channels, channels, 3, 3)) * 0.2 * 4 / channels ** 0.5).astype(np.float32),
                        f"w{i}")
        h = gb.add1("Relu", [gb.add1("Conv", [h, w], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)])
    flat = gb.add1("Flatten", [h], axis=1)
    wf = gb.constant((rng.standard_normal((channels * size * size, 10)) * 0.01).astype(np.float32), "wf")
    return gb.build([gb.add1("MatMul", [flat, wf])])


def test_helper_input_and_output_round_trip_and_a_cut_output_is_refused():
    modules = io.BytesIO(llvm_worker.frame(0, "a\nb") + llvm_worker.frame(2, "é") + llvm_worker.frame(1, ["x", "é", "", "z"]))
    assert [llvm_worker.read_module(modules) for _ in range(4)] == [(0, "a\nb"), (2, "é"), (1, "x\né\n\nz"), None]
    with pytest.raises(ValueError):
        llvm_worker.read_module(io.BytesIO(llvm_worker.frame(0, "abc")[:-1]))
    out = b"".join(len(o).to_bytes(8, "little") + o for o in (b"obj1", b"", b"object 3"))
    whole, cut = io.BytesIO(out), io.BytesIO(out[:-1])
    assert [llvm_worker.read_object(whole) for _ in range(4)] == [b"obj1", b"", b"object 3", None]
    assert [llvm_worker.read_object(cut) for _ in range(3)] == [b"obj1", b"", None]


def test_an_object_read_mapped_holds_the_same_bytes_in_a_mapping_of_its_own():
    import mmap

    big = bytes(range(256)) * 3000  # several pages, read in more than one piece
    out = b"".join(len(o).to_bytes(8, "little") + o for o in (b"obj1", big, b""))
    whole = io.BufferedReader(io.BytesIO(out), buffer_size=4096)
    got = [llvm_worker.read_object(whole, mapped=True) for _ in range(4)]
    assert isinstance(got[0], mmap.mmap) and isinstance(got[1], mmap.mmap)
    assert [g if g is None else bytes(g) for g in got] == [b"obj1", big, b"", None]
    cut = io.BytesIO(out[:len(b"obj1") + 8 + 8 + 1000])
    assert llvm_worker.read_object(cut, mapped=True) is not None and llvm_worker.read_object(cut, mapped=True) is None
    huge = (llvm_worker.MAX_OBJECT_BYTES + 1).to_bytes(8, "little") + b"x" * 64
    assert llvm_worker.read_object(io.BytesIO(huge)) is None and llvm_worker.read_object(io.BytesIO(huge), mapped=True) is None


@pytest.fixture
def split_everything(monkeypatch):
    monkeypatch.setattr(stream, "MAX_PART_BYTES", 0)  # a module per kernel group


def _run(session, seed: int = 1):
    x = {"x": np.random.default_rng(seed).standard_normal(session.lowered.inputs[0].shape, dtype=np.float32)}
    return session.run(x)


def test_helpers_give_the_same_code_as_one_process(split_everything):
    graph = _conv_graph()
    whole = compile_graph(graph, use_cache=False, jobs=1)
    split = compile_graph(graph, use_cache=False, jobs=3)
    for k, v in _run(whole).items():
        np.testing.assert_array_equal(_run(split)[k], v)


@pytest.mark.parametrize("executable", ["/bin/false", "/nonexistent/python"])
def test_a_helper_that_fails_or_cannot_start_leaves_the_work_here(split_everything, monkeypatch, executable):
    graph = _conv_graph(convs=2, seed=4)
    expected = _run(compile_graph(graph, use_cache=False, jobs=1))
    monkeypatch.setattr(llvm_worker.sys, "executable", executable)  # the helper command line is built there
    got = _run(compile_graph(graph, use_cache=False, jobs=2))
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v)


def test_helpers_are_gone_after_the_compile():
    with parallel.Helpers(2) as helpers:
        procs = list(helpers.procs)
        assert len(procs) == 2
    assert all(p.returncode is not None for p in procs) and not helpers.procs


def test_target_travels_to_the_helper_unchanged():
    for name in ("host", "x86-avx512", "rpi5", "jetson-orin"):
        t = resolve(name)
        assert target_from_json(target_to_json(t)) == t
    split = dataclasses.replace(t, threads=3, conv_parts=(((1, 8, 4, 4, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1), 2),))
    assert target_from_json(target_to_json(split)) == split


def test_only_big_graphs_get_helpers(monkeypatch):
    monkeypatch.setattr(parallel, "workers", lambda: 8)  # compile imports it from parallel when it asks
    from cuvil.edge_runtime import compile as comp

    import llvmlite.binding  # noqa: F401  (loaded: a small graph's LLVM work is done here)
    assert auto_jobs(_conv_graph(convs=2)) == 1
    big = _conv_graph(convs=comp.HELPER_WORTHY_KERNELS)
    assert auto_jobs(big) == comp.MAX_AUTO_JOBS
    fused = optimized(big, 1)  # what a compile counts when the host facts were remembered: Conv+Relu fused
    assert {n.op for n in fused.nodes} >= {"FusedConv"} and auto_jobs(fused) == comp.MAX_AUTO_JOBS


def test_a_process_without_llvm_loaded_compiles_a_small_graph_in_a_helper(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "llvmlite.binding")  # as in a device process: nothing loaded it
    assert auto_jobs(_conv_graph(convs=2)) == 2
    monkeypatch.setattr(parallel, "workers", lambda: 1)
    assert auto_jobs(_conv_graph(convs=8)) == 2  # one CPU: still a helper, not LLVM here


_EMPTY_MODULE = '; ModuleID = "t"\ndefine void @"f"() {\nentry:\n  ret void\n}\n'


def test_a_helper_tells_llvms_host_facts_then_compiles():
    with parallel.Helpers(1) as helpers:
        assert helpers.host_facts() == detect.llvm_host_facts()
        with stream.KernelStream(resolve("host"), helpers) as s:
            assert s.result(s.submit(LIGHT_LEVEL, _EMPTY_MODULE))[:4] == b"\x7fELF"


def test_a_helper_asked_nothing_yet_readies_llvm_before_its_first_line(tmp_path):
    """Its first line (the Target) comes when the parent's lowering starts; LLVM is loaded before that."""
    import os
    import time

    r, w = os.pipe()
    with os.fdopen(r, "rb", buffering=0) as inp, os.fdopen(w, "wb", buffering=0) as out:
        assert not llvm_worker.asked(inp)
        out.write(b"x")
        assert llvm_worker.asked(inp)
    with parallel.Helpers(1) as helpers:
        maps, until = f"/proc/{helpers.procs[0].pid}/maps", time.monotonic() + 30
        if not os.path.exists(maps):
            pytest.skip("no /proc/<pid>/maps to read what a process has loaded")
        while "llvmlite" not in open(maps).read() and time.monotonic() < until:
            time.sleep(0.01)
        assert "llvmlite" in open(maps).read()  # nothing was written to it yet
        with stream.KernelStream(resolve("host"), helpers) as s:
            assert s.result(s.submit(LIGHT_LEVEL, _EMPTY_MODULE))[:4] == b"\x7fELF"


def test_a_helper_that_cannot_tell_host_facts_is_stopped(monkeypatch):
    monkeypatch.setattr(llvm_worker.sys, "executable", "/bin/false")
    with parallel.Helpers(1) as helpers:
        procs = list(helpers.procs)
        assert helpers.host_facts() is None and helpers.procs == []
    assert all(p.returncode is not None for p in procs)


def test_a_cold_compile_with_helpers_never_loads_llvm_into_this_process(tmp_path):
    """Host facts, kernels, the tuner's candidates, its split part (two threads) and the pool probe all go
    to the helper: llvmlite's library (~40 MiB resident; ResNet-18's cold peak at 2 threads was 204
    against 136 MiB when the split part was built here) stays out of the compiling process, and the
    code computes what a one-process compile's does."""
    graph = _conv_graph(2, channels=64, size=32)  # a layer the cost model splits at two threads
    want = _run(compile_graph(graph, use_cache=False, jobs=1, threads=2))
    script = textwrap.dedent("""
        import dataclasses, sys
        import numpy as np
        from cuvil.edge_runtime import autotune
        from cuvil.edge_runtime.compile import compile_graph
        from tests.edge_runtime.test_parallel import _conv_graph, _run
        parts, split_seconds, tune = [], autotune._split_seconds, autotune.tune
        autotune._split_seconds = lambda *a, **k: parts.append(split_seconds(*a, **k)) or parts[-1]
        autotune.tune = lambda graph, t, *a, **k: tune(graph, dataclasses.replace(t, tuning=t.tuning.replace(
            autotune_fraction=100.0, autotune_budget_s=60.0)), *a, **k)  # a budget that times its one distinct layer
        session = compile_graph(_conv_graph(2, channels=64, size=32), cache_dir=sys.argv[1], jobs=2, tune=True,
                                threads=2)
        np.savez(sys.argv[2], **_run(session))
        print(any(p is not None for p in parts), "llvmlite.binding" in sys.modules)
    """)
    out = tmp_path / "out.npz"
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cache"), str(out)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False"]  # a split part was timed, and no llvmlite.binding
    got = np.load(out)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-4)  # tuning may pick another kernel


def test_the_graph_optimized_while_the_helper_tells_host_facts_gives_the_same_code(tmp_path, monkeypatch):
    """An empty cache (no remembered host facts) with helpers: the pass pipeline runs while the helper
    starts, and the lowering takes that graph as it would have made it."""
    from cuvil.compiler.codegen import driver

    graph = _conv_graph()
    want = _run(compile_graph(graph, use_cache=False, jobs=2))
    early, optimized = [], driver.optimized
    monkeypatch.setattr(driver, "optimized", lambda g, batch: early.append(batch) or optimized(g, batch))
    got = _run(compile_graph(graph, cache_dir=tmp_path / "cache", jobs=2))
    assert early == [1]
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)


def test_a_miss_with_the_host_facts_remembered_starts_its_helper_before_optimizing(tmp_path, monkeypatch):
    """As a miss that asks a helper for the facts does, so the helper's start-up overlaps the pass pipeline."""
    from cuvil.compiler.codegen import driver
    from cuvil.edge_runtime.cache import finish_writes

    compile_graph(_conv_graph(convs=2), cache_dir=tmp_path, jobs=2, tune=False)  # remembers this CPU's facts
    finish_writes()
    events, start, optimize = [], parallel.Helpers.__init__, driver.optimized

    def helpers(self, count, adopt=None):
        events.append(f"helpers({count}, adopted={adopt is not None})")
        start(self, count, adopt)

    def optimized_(graph, batch):
        events.append("optimized")
        return optimize(graph, batch)
    monkeypatch.setattr(parallel.Helpers, "__init__", helpers)
    monkeypatch.setattr(driver, "optimized", optimized_)
    compile_graph(_conv_graph(convs=3), cache_dir=tmp_path, jobs=2, tune=False)
    assert events == ["helpers(1, adopted=False)", "optimized", "helpers(1, adopted=True)"]
