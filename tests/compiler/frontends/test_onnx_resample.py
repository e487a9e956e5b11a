"""ONNX import of ConvTranspose (auto_pad, output_shape), Resize (scales, sizes, axes), Upsample,
Tile, Col2Im and EyeLike, run by the reference interpreter against ONNX Runtime."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper

from cuvil.compiler import run_reference
from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.edge_runtime.compile import compile_graph

from .test_onnx_frontend import check as check_against_ort
from .test_onnx_frontend import make_model

F = TensorProto.FLOAT
check = functools.partial(check_against_ort, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [dict(strides=[2, 2], auto_pad="SAME_UPPER"), dict(strides=[2, 2], auto_pad="SAME_LOWER"),
                                   dict(strides=[3, 2], output_shape=[10, 8]), dict(strides=[2, 1], output_padding=[1, 0])])
def test_conv_transpose_padding_forms(rng, attrs):
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    check(make_model([node], {"x": (F, [1, 2, 3, 4])}, ["y"], {"w": w}, 17), {"x": rng.standard_normal((1, 2, 3, 4)).astype(np.float32)})


@pytest.mark.parametrize("form", ["scales", "sizes", "axes", "not_larger"])
def test_resize_forms(rng, form):
    inits = {"roi": np.zeros(0, np.float32)}
    extra = {}
    if form == "scales":
        inits["scales"] = np.array([1, 1, 2, 1.5], np.float32)
        ins = ["x", "roi", "scales"]
    else:
        inits["scales"] = np.zeros(0, np.float32)
        inits["sizes"] = np.array([7, 3] if form != "sizes" else [1, 2, 7, 3], np.int64)
        ins = ["x", "roi", "scales", "sizes"]
        if form != "sizes":
            extra["axes"] = [2, 3]
        if form == "not_larger":
            extra["keep_aspect_ratio_policy"] = "not_larger"
    node = helper.make_node("Resize", ins, ["y"], mode="linear", **extra)
    check(make_model([node], {"x": (F, [1, 2, 4, 5])}, ["y"], inits, 18), {"x": rng.standard_normal((1, 2, 4, 5)).astype(np.float32)})


def test_upsample_is_an_asymmetric_resize(rng):
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    model = make_model([node], {"x": (F, [1, 1, 2, 3])}, ["y"], {"scales": np.array([1, 1, 2, 3], np.float32)}, 9)
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    graph = import_onnx(model)
    got = run_reference(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    assert np.array_equal(got, np.repeat(np.repeat(x, 2, axis=2), 3, axis=3))


@pytest.mark.parametrize("repeats", [[2, 3], [1, 1], [3, 0]])
def test_tile(rng, repeats):
    node = helper.make_node("Tile", ["x", "r"], ["y"])
    model = make_model([node], {"x": (F, [2, 3])}, ["y"], {"r": np.array(repeats, np.int64)}, 13)
    check(model, {"x": rng.standard_normal((2, 3)).astype(np.float32)})


@pytest.mark.parametrize("image, block, attrs", [
    ([5, 6], [2, 3], {}), ([7, 8], [3, 2], dict(strides=[2, 3], pads=[1, 0, 0, 2])),
    ([6, 9], [2, 2], dict(dilations=[2, 3], pads=[0, 1, 1, 0])), ([4, 3, 5], [2, 1, 3], dict(strides=[1, 2, 1]))])
def test_col2im(rng, image, block, attrs):
    nd = len(image)
    s, d, p = attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd), attrs.get("pads", [0] * 2 * nd)
    blocks = int(np.prod([(n + p[i] + p[nd + i] - d[i] * (b - 1) - 1) // s[i] + 1 for i, (n, b) in enumerate(zip(image, block))]))
    shape = [2, 3 * int(np.prod(block)), blocks]
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    inits = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    x = rng.standard_normal(shape).astype(np.float32)
    graph = check(make_model([node], {"x": (F, shape)}, ["y"], inits, opset=18), {"x": x}, rtol=1e-5, atol=1e-5)
    native = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(native, run_reference(graph, {graph.inputs[0]: x})[graph.outputs[0]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, k, dtype", [((3, 3), 0, None), ((3, 5), 2, TensorProto.INT32), ((4, 2), -1, F)])
def test_eye_like(shape, k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    node = helper.make_node("EyeLike", ["x"], ["y"], **attrs)
    check(make_model([node], {"x": (TensorProto.INT64, list(shape))}, ["y"], opset=22),
          {"x": np.zeros(shape, np.int64)})
