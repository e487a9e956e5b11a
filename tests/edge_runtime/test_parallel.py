"""Parallel cold compiles: the spawned LLVM helpers, their protocol, and falling back without them."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime import llvm_worker, parallel, stream
from cuvil.edge_runtime.compile import auto_jobs, compile_graph, resolve
from cuvil.edge_runtime.llvm_worker import target_from_json, target_to_json


def _conv_graph(convs: int = 4, seed: int = 0):
    """Same-shape 3x3 convs (one shared Winograd stage helper at 256 bits) and a Gemm head."""
    rng = np.random.default_rng(seed)
    gb = GraphBuilder("convs")
    h = gb.input("x", TensorType(DType.F32, (1, 16, 12, 12)))
    for i in range(convs):
        w = gb.constant((rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
        h = gb.add1("Relu", [gb.add1("Conv", [h, w], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)])
    flat = gb.add1("Flatten", [h], axis=1)
    wf = gb.constant((rng.standard_normal((16 * 12 * 12, 10)) * 0.01).astype(np.float32), "wf")
    return gb.build([gb.add1("MatMul", [flat, wf])])


def test_helper_input_and_output_round_trip_and_a_cut_output_is_refused():
    modules = io.BytesIO(llvm_worker.frame(0, "a\nb") + llvm_worker.frame(2, "é"))
    assert [llvm_worker.read_module(modules) for _ in range(3)] == [(0, "a\nb"), (2, "é"), None]
    with pytest.raises(ValueError):
        llvm_worker.read_module(io.BytesIO(llvm_worker.frame(0, "abc")[:-1]))
    out = b"".join(len(o).to_bytes(8, "little") + o for o in (b"obj1", b"", b"object 3"))
    whole, cut = io.BytesIO(out), io.BytesIO(out[:-1])
    assert [llvm_worker.read_object(whole) for _ in range(4)] == [b"obj1", b"", b"object 3", None]
    assert [llvm_worker.read_object(cut) for _ in range(3)] == [b"obj1", b"", None]


@pytest.fixture
def split_everything(monkeypatch):
    monkeypatch.setattr(stream, "MAX_PART_BYTES", 0)  # a module per kernel group


def _run(session, seed: int = 1):
    x = {"x": np.random.default_rng(seed).standard_normal((1, 16, 12, 12), dtype=np.float32)}
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

    assert auto_jobs(_conv_graph(convs=2)) == 1
    assert auto_jobs(_conv_graph(convs=comp.HELPER_WORTHY_KERNELS)) == comp.MAX_AUTO_JOBS
