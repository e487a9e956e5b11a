"""Parallel cold compiles: the module split, the spawned LLVM helpers, and falling back without them."""

from __future__ import annotations

import dataclasses

import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from cuvil.compiler import DType, TensorType
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime import llvm_worker, parallel
from cuvil.edge_runtime.compile import auto_jobs, compile_graph, resolve
from cuvil.edge_runtime.jit import init_llvm
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


def _defined_and_called(part: str) -> tuple[set[str], set[str]]:
    defined = set(re.findall(r'^define [^@]*@"([^"]+)"', part, re.M)) | set(re.findall(r'^declare [^@]*@"([^"]+)"', part, re.M))
    called = set(re.findall(r'call [^@]*@"([^"]+)"', part))
    return defined, called


def test_every_part_is_a_valid_module_that_defines_what_it_calls():
    init_llvm()
    lowered = lower(_conv_graph(), resolve("x86-avx2"))  # a profile whose 3x3 convs share Winograd helpers
    parts = [p.text for p in parallel.split_module(lowered.llvm_ir, 3)]
    assert len(parts) >= 2 and lowered.entry in parts[0]
    for part in parts:
        llvm.parse_assembly(part).verify()
        defined, called = _defined_and_called(part)
        assert called <= defined, called - defined
    helpers = [n for n in re.findall(r'^define internal [^@]*@"([^"]+)"', lowered.llvm_ir, re.M) if not re.match(r"k\d+_", n)]
    assert helpers  # the Winograd stage and its GEMM
    for name in helpers:  # a shared helper is compiled once: in exactly one part
        assert sum(bool(re.search(rf'^define [^@]*@"{re.escape(name)}"', p, re.M)) for p in parts) == 1


def test_prevectorized_conv_kernels_skip_the_module_optimizer_and_the_rest_does_not():
    lowered = lower(_conv_graph(), resolve("x86-avx512"))
    parts = parallel.split_module(lowered.llvm_ir, 1)
    assert {p.worker for p in parts} == {0}
    light = [p for p in parts if p.speed_level == parallel.LIGHT_LEVEL]
    full = [p for p in parts if p.speed_level == parallel.FULL_LEVEL]
    assert len(light) == 1 and len(full) == 1 and parallel.LIGHT_LEVEL < parallel.FULL_LEVEL
    defines = [re.findall(r'^define [^@]*@"([^"]+)"', p.text, re.M) for p in (full[0], light[0])]
    assert lowered.entry in defines[0] and "k1_MatMul" in defines[0] and not any("Conv" in n for n in defines[0])
    assert {"k0_FusedConv", "k0_FusedConv_mk"} <= set(defines[1]) and not any("MatMul" in n for n in defines[1])


def test_a_model_without_prevectorized_kernels_stays_one_module_in_one_process():
    lowered = lower(_conv_graph(convs=0), resolve("x86-avx512"))
    assert parallel.split_module(lowered.llvm_ir, 1) == [parallel.Part(lowered.llvm_ir, parallel.FULL_LEVEL, 0)]


def test_helper_input_and_output_round_trip_and_a_cut_output_is_refused():
    target = resolve("x86-avx2")
    got_target, modules = llvm_worker._read_modules(llvm_worker.write_modules(target, [(0, "a\nb"), (2, "é")]))
    assert got_target == target and modules == [(0, "a\nb"), (2, "é")]
    out = b"".join(len(o).to_bytes(8, "little") + o for o in (b"obj1", b"", b"object 3"))
    assert llvm_worker.read_objects(out) == [b"obj1", b"", b"object 3"]
    assert llvm_worker.read_objects(out[:-1]) is None and llvm_worker.read_objects(out + b"\0") is None


@pytest.fixture
def split_everything(monkeypatch):
    monkeypatch.setattr(parallel, "MIN_SPLIT_BYTES", 0)


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
