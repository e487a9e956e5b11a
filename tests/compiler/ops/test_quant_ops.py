"""Quant ops: references against hand-computed ONNX rounding and against ONNX Runtime's integer ops."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType
from cuvil.compiler.errors import ShapeError
from cuvil.compiler.ir.infer import infer_op
from cuvil.compiler.ops import get_op
from cuvil.compiler.ops.quant import multiplier

from .ort_check import Const, run_ort


def ref(op, xs, **attrs):
    return get_op(op).reference(xs, get_op(op).normalize_attrs(attrs))[0]


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, np.nan, 1e30], np.float32)
    got = ref("QuantizeLinear", [x], scale=[1.0], zero_point=[0], to=DType.I8)
    assert got.tolist() == [0, 2, 2, 0, -2, 127, -128, -128, 127]
    got = ref("QuantizeLinear", [x], scale=[1.0], zero_point=[10], to=DType.U8)
    assert got.tolist() == [10, 12, 12, 10, 8, 255, 0, 0, 255]


def test_quantize_and_dequantize_equal_onnx_runtime_per_tensor_and_per_channel():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32) * 3
    for to, zps in ((DType.U8, [128, 3, 250]), (DType.I8, [0, -5, 7])):
        scales = np.array([0.02, 0.05, 0.011], np.float32)
        zp = np.array(zps, to.numpy)
        want = run_ort("QuantizeLinear", [x, Const(scales), Const(zp)], {"axis": 1})[0]
        got = ref("QuantizeLinear", [x], scale=scales, zero_point=zps, axis=1, to=to)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        back = run_ort("DequantizeLinear", [want, Const(scales), Const(zp)], {"axis": 1})[0]
        assert np.array_equal(ref("DequantizeLinear", [got], scale=scales, zero_point=zps, axis=1), back)
        one = run_ort("QuantizeLinear", [x, Const(np.float32(0.03)), Const(zp[:1].reshape(()))])[0]
        assert np.array_equal(ref("QuantizeLinear", [x], scale=[0.03], zero_point=zps[:1], to=to), one)


def _qlinear_conv_case(rng, x_dtype, group=1, bias=True):
    c, m = 4 * group, 6 * group
    x = rng.integers(0, 256, (1, c, 7, 6)).astype(np.uint8) if x_dtype is DType.U8 else \
        rng.integers(-128, 128, (1, c, 7, 6)).astype(np.int8)
    w = rng.integers(-127, 128, (m, c // group, 3, 3)).astype(np.int8)
    b = rng.integers(-5000, 5000, (m,)).astype(np.int32)
    ws = (rng.random(m).astype(np.float32) + 0.5) * 0.01
    xz = 131 if x_dtype is DType.U8 else -3
    return x, w, b if bias else None, ws, xz


@pytest.mark.parametrize("x_dtype,group,bias", [(DType.U8, 1, True), (DType.I8, 2, False), (DType.U8, 2, True)])
def test_qconv_equals_onnx_runtime_qlinearconv(x_dtype, group, bias):
    rng = np.random.default_rng(1)
    x, w, b, ws, xz = _qlinear_conv_case(rng, x_dtype, group, bias)
    xs, ys, yz = np.float32(0.05), np.float32(0.8), 120 if x_dtype is DType.U8 else -7
    attrs = dict(strides=[1, 2], pads=[1, 0, 1, 1], dilations=[1, 1], group=group)
    onnx_in = [x, Const(xs), Const(np.array(xz, x.dtype)), Const(w), Const(ws), Const(np.zeros(len(ws), np.int8)),
               Const(ys), Const(np.array(yz, x.dtype))] + ([Const(b)] if bias else [])
    want = run_ort("QLinearConv", onnx_in, attrs)[0]
    got = ref("QConv", [x, w] + ([b] if bias else []), x_scale=xs, x_zero_point=xz, w_scale=ws, y_scale=ys,
              y_zero_point=yz, to=x_dtype, **attrs)
    assert got.dtype == x.dtype and got.shape == want.shape
    assert np.abs(got.astype(int) - want).max() <= 1  # ORT's requantization may differ by one quantum
    assert np.mean(got == want) > 0.95


def test_qconv_requantizes_with_float32_multiplier_exactly():
    x = np.array([[[[10]]]], np.uint8)
    w = np.array([[[[3]]], [[[-7]]]], np.int8)
    b = np.array([5, 1000], np.int32)
    got = ref("QConv", [x, w, b], strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], x_scale=0.5, x_zero_point=2,
              w_scale=[0.25, 0.125], y_scale=0.1, y_zero_point=-10, to=DType.I8, clamp=[-10, 127])
    m = multiplier(0.5, [0.25, 0.125], 0.1)
    acc = np.array([(10 - 2) * 3 + 5, (10 - 2) * -7 + 1000], np.float32)
    want = np.clip(np.rint(acc * m) - 10, -10, 127)
    assert got.reshape(-1).tolist() == want.astype(int).tolist()


def test_qmatmul_and_qadd_within_one_quantum_of_onnx_runtime():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (3, 16)).astype(np.uint8)
    bw = rng.integers(-127, 128, (16, 5)).astype(np.int8)
    want = run_ort("QLinearMatMul", [a, Const(np.float32(0.02)), Const(np.uint8(128)), Const(bw),
                                     Const(np.float32(0.01)), Const(np.int8(0)), Const(np.float32(0.05)),
                                     Const(np.uint8(100))], opset=13)[0]
    got = ref("QMatMul", [a, bw], a_scale=0.02, a_zero_point=128, b_scale=[0.01], y_scale=0.05, y_zero_point=100)
    assert np.abs(got.astype(int) - want).max() <= 1
    b = rng.integers(0, 256, (3, 16)).astype(np.uint8)
    fa = (a.astype(np.float64) - 128) * 0.02
    fb = (b.astype(np.float64) - 7) * 0.03
    want = np.clip(np.rint((fa + fb) / 0.04) + 9, 0, 255)
    got = ref("QAdd", [a, b], a_scale=0.02, a_zero_point=128, b_scale=0.03, b_zero_point=7, y_scale=0.04,
              y_zero_point=9)
    assert np.abs(got.astype(int) - want).max() <= 1


def test_quant_ops_reject_bad_operands():
    f32, u8, i8 = (TensorType(d, (1, 4, 3, 3)) for d in (DType.F32, DType.U8, DType.I8))
    q = get_op("QuantizeLinear")
    with pytest.raises(ShapeError, match="scales for axis"):
        infer_op("QuantizeLinear", [f32], q.normalize_attrs(dict(scale=[1.0, 2.0], zero_point=[0, 0])))
    with pytest.raises(ShapeError, match="finite and > 0"):
        infer_op("QuantizeLinear", [f32], q.normalize_attrs(dict(scale=[0.0], zero_point=[0])))
    with pytest.raises(ShapeError, match="range"):
        infer_op("QuantizeLinear", [f32], q.normalize_attrs(dict(scale=[1.0], zero_point=[300])))
    with pytest.raises(ShapeError, match="float"):
        infer_op("QuantizeLinear", [u8], q.normalize_attrs(dict(scale=[1.0], zero_point=[0])))
    c = get_op("QConv").normalize_attrs(dict(strides=[1, 1], pads=[0] * 4, dilations=[1, 1], x_scale=1.0,
                                             w_scale=[1.0], y_scale=1.0))
    with pytest.raises(ShapeError, match="weights must be i8"):
        infer_op("QConv", [u8, u8], c)
    assert infer_op("QConv", [u8, i8], c)[0] == TensorType(DType.U8, (1, 1, 1, 1))  # W [1, 4, 3, 3]: one filter


def test_dequantize_is_never_folded_into_float_weights():
    assert not get_op("DequantizeLinear").foldable and get_op("QuantizeLinear").foldable
