"""3-D convolution on the CPU (the direct N-d code of ``codegen/gathers``), plain and fused with a
residual and an activation, against the reference (``test_nvptx`` re-runs the plain one on the
simulated GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.passes.pipeline import optimize
from cuvil.edge_runtime.compile import compile_graph
from tests.compiler.codegen.test_kernels import rnd, run_op

CONV3D = [  # x shape, w shape, attrs
    ((1, 2, 4, 5, 6), (3, 2, 2, 3, 2), dict(strides=[1, 1, 1], pads=[0] * 6, dilations=[1, 1, 1], group=1)),
    ((2, 4, 5, 4, 5), (6, 2, 3, 3, 3), dict(strides=[2, 1, 2], pads=[1, 0, 1, 1, 1, 0], dilations=[1, 2, 1], group=2)),
    # 72 taps: the first two kernel axes are loops, the last one unrolled (gathers.UNROLLED_TAPS)
    ((1, 2, 5, 9, 8), (4, 1, 2, 6, 6), dict(strides=[1, 2, 1], pads=[1, 2, 0, 0, 1, 3], dilations=[2, 1, 1], group=2)),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs, ws, attrs", CONV3D)
def test_conv_3d(xs, ws, attrs, bias):
    consts = [rnd(*ws, seed=2)] + ([rnd(ws[0], seed=3)] if bias else [])
    run_op("Conv", [rnd(*xs, seed=1)], consts, **attrs)


def test_conv_3d_fused_with_residual_and_relu():
    xs, ws, attrs = CONV3D[0]
    gb = GraphBuilder("conv3d")
    x = gb.input("x", TensorType(DType.F32, xs))
    r = gb.input("r", TensorType(DType.F32, (1, 3, 3, 3, 5)))
    conv = gb.add1("Conv", [x, gb.constant(rnd(*ws, seed=2), "w"), gb.constant(rnd(3, seed=3), "b")], **attrs)
    y = gb.add1("Relu", [gb.add1("Add", [conv, r])])
    graph = gb.build([y])
    assert [n.op for n in optimize(graph).nodes] == ["FusedConv"]
    feeds = {"x": rnd(*xs, seed=4), "r": rnd(1, 3, 3, 3, 5, seed=5)}
    got = compile_graph(graph, optimize=True).run(feeds)[y]
    np.testing.assert_allclose(got, run_reference(graph, feeds)[y], rtol=1e-4, atol=1e-5)
