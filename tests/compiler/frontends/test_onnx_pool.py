"""ONNX AveragePool with dilations and LpPool (window sums through a depthwise Conv) against ONNX
Runtime, on the reference interpreter and natively."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from cuvil.compiler import run_reference
from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.edge_runtime.compile import compile_graph

from .test_onnx_frontend import make_model, run_ort

F = TensorProto.FLOAT

WINDOWS = [  # x shape, attributes
    ((1, 2, 7, 8), dict(kernel_shape=[3, 2], dilations=[2, 3], strides=[1, 2], pads=[1, 0, 2, 1])),
    ((2, 3, 9), dict(kernel_shape=[3], dilations=[2], strides=[2], pads=[1, 1], ceil_mode=1)),
    ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 2, 3], dilations=[2, 1, 2], strides=[2, 2, 1], pads=[0] * 6, ceil_mode=1)),
    ((1, 1, 6, 6), dict(kernel_shape=[3, 3], dilations=[1, 2], pads=[2, 2, 2, 2])),
]


def check(model, x, rtol=1e-5, atol=1e-5):
    graph = import_onnx(model)
    want = next(iter(run_ort(model, {"x": x}).values()))
    got = run_reference(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    native = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(native, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("shape, attrs", WINDOWS, ids=str)
def test_dilated_average_pool(rng, shape, attrs, include_pad):
    node = helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=include_pad, **attrs)
    check(make_model([node], {"x": (F, list(shape))}, ["y"], opset=19), rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape, attrs", WINDOWS, ids=str)
def test_lp_pool(rng, shape, attrs, p):
    node = helper.make_node("LpPool", ["x"], ["y"], p=p, **attrs)
    check(make_model([node], {"x": (F, list(shape))}, ["y"], opset=18), rng.standard_normal(shape).astype(np.float32),
          rtol=1e-4)


def test_lp_pool_same_lower():
    x = np.arange(35, dtype=np.float32).reshape(1, 1, 5, 7) / 10
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER")
    check(make_model([node], {"x": (F, [1, 1, 5, 7])}, ["y"], opset=18), x, rtol=1e-4)


def test_lp_pool_of_integers_is_unsupported():
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2])
    with pytest.raises(UnsupportedModelError, match="LpPool"):
        import_onnx(make_model([node], {"x": (TensorProto.INT32, [1, 1, 4])}, ["y"], opset=18))


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("shape, attrs", [((2, 3, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
                                          ((1, 2, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
                                          ((1, 1, 4, 5, 6), dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]))], ids=str)
def test_max_pool_indices(rng, shape, attrs, storage_order):
    x = rng.integers(-4, 4, shape).astype(np.float32)  # ties: the first in the window wins
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], storage_order=storage_order, **attrs)
    model = make_model([node], {"x": (F, list(shape))}, ["y", "i"], opset=12)
    graph = import_onnx(model)
    native = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})
    for name, want in zip(graph.outputs, run_ort(model, {"x": x}).values()):
        np.testing.assert_array_equal(native[name], want)
        np.testing.assert_array_equal(run_reference(graph, {graph.inputs[0]: x})[name], want)
