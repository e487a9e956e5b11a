"""Conversions of scalar_ops.cast_value that LLVM leaves undefined, checked per x86 profile the host runs."""

from __future__ import annotations

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime.compile import compile_graph

from tests.hosts import executable

F32 = np.float32


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("dst", [np.uint8, np.int8, np.uint16, np.int16, np.uint32])
def test_float_to_narrow_int_casts_wrap_like_numpy_on_every_profile(profile, dst):
    """Out of the target's range a float truncates and wraps (-2.7 -> uint8 254, 300.7 -> 44), the same on
    every CPU: a direct conversion there is undefined in LLVM, and Emerald Rapids code gave 0 for 254."""
    target = executable(profile)
    x = np.array([[-2.7, -2.4, 2.4, 300.7, -300.2, -0.5, 70000.9, -70000.2]] * 5, F32)
    gb = GraphBuilder("t_cast_wrap")
    graph = gb.build(gb.add("Cast", [gb.input("x", TensorType(DType.F32, x.shape))], to=DType.from_numpy(dst)))
    got = compile_graph(graph, target=target, optimize=False).run({"x": x})[graph.outputs[0]]
    want = np.trunc(x).astype(np.int64).astype(dst)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})[graph.outputs[0]], want)
    assert want[0, 0] == np.array(-2).astype(dst)
