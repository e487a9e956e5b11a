"""Native kernels at the edges of float ranges, against values written out: where f16 sums round,
log meets subnormals, tanh saturates, a zero keeps its sign, LogSoftmax meets a large maximum."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.compiler.codegen.test_kernels import F32, run_op


def test_log_of_subnormals():
    """The exponent of a subnormal float is not its bit field: log(1e-40) gave -88.02 (log of 2^-126
    and so on), where underflowed probabilities (log of a softmax) land."""
    x = np.array([1e-40, 1e-38, 2.0**-149, 2.0**-127, 2.0**-126], F32)
    got = next(iter(run_op("Log", [x]).run({"x0": x}).values()))
    want = np.array([math.log(float(v)) for v in x], F32)
    np.testing.assert_allclose(got, want, rtol=2e-7)

@pytest.mark.parametrize("dtype", [F32, np.float16])
def test_tanh_saturates_at_one(dtype):
    """tanh is exactly +-1 where float rounds it there (the approximation stopped at 1 - 2^-22), so
    Gelu's x (1 + tanh) is -0 for large negative x (it gave -1.2e-3 at -1e4) and NaN at -inf."""
    x = np.array([9.0, -9.0, 100.0, -1e4, np.inf, -np.inf], dtype)
    tanh = next(iter(run_op("Tanh", [x]).run({"x0": x}).values()))
    np.testing.assert_array_equal(tanh, np.array([1, -1, 1, -1, 1, -1], dtype))
    neg = np.array([-100.0, -1e4, -np.inf], dtype)
    gelu = next(iter(run_op("Gelu", [neg], approximate="tanh").run({"x0": neg}).values()))
    np.testing.assert_array_equal(gelu, np.array([-0.0, -0.0, np.nan], dtype))

@pytest.mark.parametrize("dtype", [F32, np.float16])
def test_pow_of_a_signed_zero_follows_c(dtype):
    """An odd integer power keeps zero's sign (C99's pow, NumPy, ONNX Runtime): (-0) ** -3 gave +inf."""
    x = np.array([-0.0, -0.0, -0.0, -0.0, -0.0, -0.0, 0.0, 0.0], dtype)
    y = np.array([-3.0, -1.0, 3.0, 5.0, 2.0, -2.0, -3.0, 3.0], dtype)
    want = np.array([-np.inf, -np.inf, -0.0, -0.0, 0.0, np.inf, np.inf, 0.0], dtype)
    sess = run_op("Pow", [x, y])
    got = next(iter(sess.run({"x0": x, "x1": y}).values()))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))

@pytest.mark.parametrize("dtype", [F32, np.float16])
def test_pow_of_a_constant_half_is_c_pow_not_sqrt(dtype):
    """x ** 0.5 at the edges is C's pow, as ONNX Runtime gives: +0 for -0 and +inf for -inf (sqrt,
    which the constant exponent is lowered to, and NumPy's power gave -0 and NaN)."""
    x = np.array([-0.0, -np.inf, 0.0, 4.0, np.inf, -1.0], dtype)
    want = np.array([0.0, np.inf, 0.0, 2.0, np.inf, np.nan], dtype)
    got = next(iter(run_op("Pow", [x], [np.array(0.5, dtype)]).run({"x0": x}).values()))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got[:5]), np.signbit(want[:5]))

@pytest.mark.parametrize("op, attrs, shape, summed", [
    ("ReduceSum", dict(axes=(0,)), (5000, 2), 5000),
    ("ReduceSum", dict(axes=(1,)), (2, 5000, 3), 5000),
    ("ReduceMean", dict(axes=(0,)), (5000, 3), None),
    ("GlobalAveragePool", {}, (1, 2, 80, 80), None),
    ("AveragePool", dict(kernel_shape=(64, 64), strides=(64, 64), pads=(0, 0, 0, 0)), (1, 1, 64, 64), None)])
@pytest.mark.parametrize("value", [1.0, 1.1])
def test_half_sums_accumulate_in_f32(op, attrs, shape, summed, value):
    """In f16 5,000 ones summed to 2,048 (2,048 + 1 rounds back) and a mean of 1.1 came out 0.82:
    f16 sums and average pools accumulate in f32 and round once, as the reference (``summed``: the
    elements of each sum; None: a mean, which is the value itself)."""
    x = np.full(shape, value, np.float16)
    got = next(iter(run_op(op, [x], **attrs).run({"x0": x}).values()))
    exact = float(np.float16(value)) * (summed or 1)
    np.testing.assert_array_equal(got, np.full(got.shape, exact, np.float16))

@pytest.mark.parametrize("dtype", [F32, np.float16])
def test_log_softmax_of_large_values_keeps_the_log(dtype):
    """(x - max) - log(sum), not x - (max + log(sum)), which rounded log(sum) away next to a large max
    ([1e30, 1e30, -1e30] gave 0 for -log 2; f16 [1000, 1001, 999] gave -1.5 for -1.408)."""
    rows = [[1000.0, 1001.0, 999.0], [100.0, 100.5, 99.0]] if dtype == np.float16 else \
        [[1e30, 1e30, -1e30], [30000.0, 30000.0, 30000.0]]
    x = np.array(rows, dtype)
    want = np.array([[v - max(r) - math.log(sum(math.exp(u - max(r)) for u in r)) for v in r] for r in rows], dtype)
    sess = run_op("LogSoftmax", [x], axis=-1)
    np.testing.assert_array_equal(next(iter(sess.run({"x0": x}).values())), want)


@pytest.mark.parametrize("dtype", [F32, np.float64])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_over_a_middle_axis_at_the_edges(op, dtype):
    """Over an axis with elements after it, the lines run side by side (one vector of lines): each line's
    max, sum and result are its own, a NaN, an infinity or a large maximum in one line touch no other."""
    x = np.zeros((2, 4, 5), dtype)
    x[0, :, 0] = [1e30, 1e30, -1e30, 0.0]
    x[0, :, 1] = [np.nan, 1.0, 2.0, 3.0]
    x[0, :, 2] = -np.inf
    x[0, :, 3] = [np.inf, 1.0, 2.0, 3.0]
    x[1] = np.arange(20, dtype=dtype).reshape(4, 5) * 50.0
    ref = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        shifted = ref - ref.max(axis=1, keepdims=True)
        sums = np.exp(shifted).sum(axis=1, keepdims=True)
        want = (shifted - np.log(sums) if op == "LogSoftmax" else np.exp(shifted) / sums).astype(dtype)
    got = next(iter(run_op(op, [x], axis=1).run({"x0": x}).values()))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert np.array_equal(np.isnan(got), np.isnan(want))
