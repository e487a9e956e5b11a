"""Half precision without library calls: double -> half rounds once (as NumPy does), f16 math is
computed in f32 and rounded back; both natively, against NumPy and the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime.compile import compile_graph


def _one_op(op: str, x: np.ndarray, **attrs):
    gb = GraphBuilder(f"half_{op}")
    name = gb.input("x", TensorType(DType.from_numpy(x.dtype), x.shape))
    graph = gb.build(gb.add(op, [name], **attrs))
    return graph, compile_graph(graph, use_cache=False, optimize=False).run({name: x})[graph.outputs[0]]


def _double_to_half_edges() -> np.ndarray:
    """Halfway points between neighbouring halves, nudged by one double ulp either way, plus
    overflow, subnormal, zero, infinity and NaN: where a double rounding would go wrong."""
    halves = np.arange(0, 0x7C00, 97, dtype=np.uint16).view(np.float16).astype(np.float64)
    nxt = np.nextafter(halves.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    mid = (halves + nxt) / 2
    values = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), halves,
                             [65504.0, 65519.99, 65520.0, 1e6, 5.96e-8, 2.98e-8, 2.9802322387695312e-08, 1e-30,
                              0.0, np.inf, np.nan]])
    return np.concatenate([values, -values])


def test_double_to_half_rounds_once_like_numpy():
    x = _double_to_half_edges()
    _, got = _one_op("Cast", x, to=DType.F16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
        assert (x.astype(np.float32).astype(np.float16) != want).any()  # rounding twice would fail here
    np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


def test_half_to_double_is_exact():
    x = np.arange(0, 0x10000, 13, dtype=np.uint16).view(np.float16)
    _, got = _one_op("Cast", x, to=DType.F64)
    np.testing.assert_array_equal(got, x.astype(np.float64))


@pytest.mark.parametrize("op", ["Exp", "Log", "Sigmoid", "Tanh", "Erf", "Sqrt", "Gelu"])
def test_half_math_is_computed_in_f32(op):
    x = np.random.default_rng(3).uniform(0.05 if op in ("Log", "Sqrt") else -6, 6, 257).astype(np.float16)
    graph, got = _one_op(op, x)
    want = run_reference(graph, {"x": x})[graph.outputs[0]]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-3)


def _graph(op: str, xs: list[np.ndarray], **attrs):
    gb = GraphBuilder(f"half_{op}")
    names = [gb.input(f"x{i}", TensorType(DType.from_numpy(x.dtype), x.shape)) for i, x in enumerate(xs)]
    graph = gb.build(gb.add(op, names, **attrs))
    feeds = dict(zip(names, xs))
    out = graph.outputs[0]
    return compile_graph(graph, use_cache=False, optimize=False).run(feeds)[out], run_reference(graph, feeds)[out]


def test_half_matmul_and_conv_sum_in_f32_and_round_once():
    """Exact f32 sums (eighths) whose f16 rounding differs from summing into an f16 output."""
    rng = np.random.default_rng(5)
    a, b = (rng.integers(-40, 40, s) / 8 for s in ((2, 3, 5, 33), (2, 3, 33, 4)))
    a, b = a.astype(np.float16), b.astype(np.float16)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    for got in _graph("MatMul", [a, b]):
        np.testing.assert_array_equal(got, want)
    x, w = (rng.integers(-40, 40, s) / 8 for s in ((1, 4, 9), (4, 1, 4)))
    x, w = x.astype(np.float16), w.astype(np.float16)
    want = np.stack([np.convolve(x[0, c].astype(np.float32), w[c, 0, ::-1].astype(np.float32), "valid")
                     for c in range(4)])[None].astype(np.float16)
    for got in _graph("Conv", [x, w], group=4, pads=(0, 0), strides=(1,), dilations=(1,)):
        np.testing.assert_array_equal(got, want)


def test_half_softmax_rounds_as_onnx_reference():
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(2).normal(0, 3, (4, 3, 37)).astype(np.float16)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    model = helper.make_model(helper.make_graph([node], "s", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, x.shape)],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT16, x.shape)]))
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for got in _graph("Softmax", [x], axis=-1):
        assert got.dtype == np.float16
        ulps = np.abs(got.view(np.int16).astype(np.int32) - want.view(np.int16).astype(np.int32))
        assert ulps.max() <= 1 and (ulps == 0).mean() > 0.99
