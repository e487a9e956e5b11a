"""More native kernel checks: other dtypes, storage shared by a fused residual, kernel dedupe.

Kept apart from ``test_kernels.py`` (whose op-by-op tests the NVPTX simulator re-runs by name).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.codegen.cpu.kernels import KERNELS
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ops import OP_TABLE
from cuvil.edge_runtime.compile import compile_graph

from .test_kernels import ATOL, BOOL, I64, RTOL, UNARY, rnd, run_op


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_f64(op):
    run_op(op, [rnd(3, 19, lo=-6, hi=6, dtype=np.float64)], **UNARY[op])


def test_f64_math():
    run_op("Log", [rnd(3, 19, lo=0.01, hi=9, dtype=np.float64)])
    run_op("Pow", [rnd(3, 19, lo=0.1, hi=3, dtype=np.float64), rnd(19, lo=-2, hi=2, dtype=np.float64)])


@pytest.mark.parametrize("dtype", [I64, BOOL, np.uint8, np.float64])
def test_data_movement_other_dtypes(dtype):
    x = rnd(2, 3, 19, dtype=dtype)
    run_op("Transpose", [x], perm=(2, 0, 1))
    run_op("Concat", [x, x], axis=1)
    run_op("Slice", [x], starts=(1,), ends=(17,), axes=(2,), steps=(3,))
    run_op("Gather", [x, np.array([1, 0], I64)], axis=1)
    run_op("Pad", [x], pads=(0, 1, 2, 0, 0, 1), mode="edge")
    run_op("Expand", [rnd(3, 1, dtype=dtype)], shape=(2, 3, 4))
    run_op("Where", [rnd(3, 19, dtype=BOOL), x, rnd(19, dtype=dtype, seed=9)])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_int(dtype):
    x = rnd(1, 2, 7, 9, dtype=dtype, lo=-20, hi=20) if dtype == np.int8 else np.abs(rnd(1, 2, 7, 9, dtype=np.int32)).astype(dtype)
    run_op("MaxPool", [x], kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1))


@pytest.mark.parametrize("op", ["FusedConv", "FusedGemm"])
@pytest.mark.parametrize("w_const", [True, False])
def test_fused_residual_sharing_the_output(op, w_const, monkeypatch):
    """The planner may let R share the output's storage; the kernel then starts from it. R is computed
    (R = r * 1), as the plan checker admits a handover only from a value that dies at the node."""
    import dataclasses

    from cuvil.compiler.codegen import driver

    real = driver.plan_memory

    def shared(graph, batch, alignment=64, held=None):
        plan = real(graph, batch, alignment, held)
        node = graph.nodes[-1]
        offsets = dict(plan.offsets)
        offsets[node.outputs[0]] = offsets[node.inputs[-1]]
        return dataclasses.replace(plan, offsets=offsets)

    monkeypatch.setattr(driver, "plan_memory", shared)
    if op == "FusedConv":
        x, w, r = rnd(1, 3, 9, 11), rnd(8, 3, 3, 3, seed=1), rnd(1, 8, 9, 11, seed=3)
        attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}
    else:
        x, w, r, attrs = rnd(3, 37), rnd(19, 37, seed=1), rnd(3, 19, seed=4), {"transB": 1}
    gb = GraphBuilder("t_shared")
    xi = gb.input("x", TensorType(DType.F32, x.shape))
    wi = gb.constant(w, "w") if w_const else gb.input("w", TensorType(DType.F32, w.shape))
    bi = gb.constant(rnd(w.shape[0], seed=2), "b")
    ri = gb.add1("Mul", [gb.input("r", TensorType(DType.F32, r.shape)), gb.constant(np.ones(1, np.float32), "one")])
    out = gb.add1(op, [xi, wi, bi, ri], activation="Relu", has_bias=1, has_residual=1, **attrs)
    graph = gb.build([out])
    feeds = {"x": x, "r": r, **({} if w_const else {"w": w})}
    sess = compile_graph(graph, optimize=False)
    assert sess.memory_plan.offsets[out] == sess.memory_plan.offsets[ri]
    np.testing.assert_allclose(sess.run(feeds)[out], run_reference(graph, feeds)[out], rtol=RTOL, atol=ATOL)


def test_identical_kernels_are_emitted_once():
    from cuvil.compiler.codegen.lower import lower
    from cuvil.edge_runtime.jit import host_target

    gb = GraphBuilder("dedupe")
    x = gb.input("x", TensorType(DType.F32, (3, 37)))
    y = gb.add1("Relu", [gb.add1("Relu", [gb.add1("Sigmoid", [x])])])
    graph = gb.build([gb.add1("Sigmoid", [y])])
    lowered = lower(graph, host_target(), optimize=False)
    assert lowered.node_count == 4 and lowered.kernel_count <= 3
    assert lowered.llvm_ir.count("define internal void @\"k") == lowered.kernel_count


def test_every_op_has_a_kernel():
    assert sorted(set(OP_TABLE) - set(KERNELS)) == []
