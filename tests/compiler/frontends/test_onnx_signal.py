"""ONNX DFT (one MatMul with a constant matrix) against ONNX Runtime, on the reference interpreter
and natively."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from cuvil.compiler import run_reference
from cuvil.compiler.frontends.onnx import OnnxImportError, import_onnx
from cuvil.edge_runtime.compile import compile_graph

from .test_onnx_frontend import make_model, run_ort

F = TensorProto.FLOAT


def check(model, x):
    graph = import_onnx(model)
    want = next(iter(run_ort(model, {"x": x}).values()))
    got = run_reference(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    native = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(native, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("parts, inverse, onesided", [(1, 0, 0), (2, 0, 0), (1, 1, 0), (2, 1, 0), (1, 0, 1)])
@pytest.mark.parametrize("axis, length", [(1, None), (2, None), (1, 5), (-2, 12)])
def test_dft(rng, parts, inverse, onesided, axis, length):
    """(ONNX Runtime takes onesided for a real forward transform only.)"""
    shape = [2, 7, 8, parts]
    attrs = dict(inverse=inverse, onesided=onesided, axis=axis)
    inputs = ["x", "len"] if length else ["x"]
    inits = {"len": np.array(length, np.int64)} if length else {}
    node = helper.make_node("DFT", inputs, ["y"], **attrs)
    check(make_model([node], {"x": (F, shape)}, ["y"], inits, opset=17), rng.standard_normal(shape).astype(np.float32))


def test_dft_20_takes_its_axis_as_an_input(rng):
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"])
    model = make_model([node], {"x": (F, [3, 6, 4, 2])}, ["y"], {"axis": np.array(-3, np.int64)}, opset=20)
    check(model, rng.standard_normal((3, 6, 4, 2)).astype(np.float32))


@pytest.mark.parametrize("length", [None, 9])
def test_inverse_onesided_dft_is_irfft(rng, length):
    x = rng.standard_normal((2, 5, 3, 2)).astype(np.float32)
    node = helper.make_node("DFT", ["x", "len"] if length else ["x"], ["y"], inverse=1, onesided=1, axis=1)
    inits = {"len": np.array(length, np.int64)} if length else {}
    graph = import_onnx(make_model([node], {"x": (F, [2, 5, 3, 2])}, ["y"], inits, opset=17))
    want = np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=length or 8, axis=1)[..., None]
    got = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dft_refuses_the_complex_axis():
    node = helper.make_node("DFT", ["x"], ["y"], axis=2)
    with pytest.raises(OnnxImportError, match="signal axis"):
        import_onnx(make_model([node], {"x": (F, [1, 4, 2])}, ["y"], opset=17))


@pytest.mark.parametrize("window, onesided", [(False, 1), (True, 1), (True, 0)])
def test_stft(rng, window, onesided):
    x = rng.standard_normal((2, 40, 1)).astype(np.float32)
    inits = {"step": np.array(6, np.int64), "len": np.array(10, np.int64)}
    inputs = ["x", "step", "w", "len"] if window else ["x", "step", "", "len"]
    if window:
        inits["w"] = np.hanning(10).astype(np.float32)
    node = helper.make_node("STFT", inputs, ["y"], onesided=onesided)
    check(make_model([node], {"x": (F, [2, 40, 1])}, ["y"], inits, opset=17), x)
