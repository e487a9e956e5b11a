"""Native kernels of the math and logic elementwise ops against the reference interpreter
(``test_nvptx`` re-runs them on the simulated GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compiler.codegen.test_kernels import rnd, run_op

DOMAINS = {
    "Floor": (-6, 6), "Ceil": (-6, 6), "Round": (-6, 6), "Sign": (-3, 3), "Sin": (-20, 20), "Cos": (-20, 20),
    "Tan": (-1.4, 1.4), "Asin": (-1, 1), "Acos": (-1, 1), "Atan": (-30, 30), "Sinh": (-9, 9), "Cosh": (-9, 9),
    "Asinh": (-50, 50), "Acosh": (1, 50), "Atanh": (-0.99, 0.99),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("op", sorted(DOMAINS))
def test_float_unary_math(op, dtype):
    lo, hi = DOMAINS[op]
    run_op(op, [rnd(3, 37, lo=lo, hi=hi).astype(dtype)])


def test_math_near_zero_keeps_relative_accuracy():
    x = np.array([1e-6, -1e-6, 1e-3, -2e-3, 0.0, 0.3, -0.45, 0.55], np.float32)
    for op in ("Sin", "Tan", "Asin", "Atan", "Sinh", "Asinh", "Atanh"):
        run_op(op, [x])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_sign_and_bitwise_on_integers(dtype):
    x, y = rnd(4, 33, dtype=dtype, seed=1), rnd(4, 33, dtype=dtype, seed=2)
    run_op("Sign", [x])
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        run_op(op, [x, y])
    run_op("BitwiseNot", [x])


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64])
def test_bitshift(direction, dtype):
    x = rnd(5, 13, dtype=dtype, lo=-20, hi=20, seed=3)
    bits = np.dtype(dtype).itemsize * 8
    counts = np.arange(-2, 63).astype(dtype)[:13] % (bits + 3) if np.dtype(dtype).kind == "u" else np.arange(-2, 11).astype(dtype) * (bits // 8)
    run_op("BitShift", [x, np.broadcast_to(counts, x.shape).copy()], direction=direction)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_mod(fmod, dtype):
    x = rnd(3, 17, dtype=dtype, lo=-9, hi=9, seed=4)
    y = rnd(3, 17, dtype=dtype, lo=-4, hi=4, seed=5)
    y = np.where(y == 0, 3, y).astype(dtype)
    run_op("Mod", [x, y], fmod=fmod)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    run_op(op, [rnd(3, 17, dtype=np.bool_, seed=6), rnd(17, dtype=np.bool_, seed=7)])


def test_not_isnan_isinf_and_inclusive_comparisons():
    run_op("Not", [rnd(2, 19, dtype=np.bool_)])
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, 3.5] * 3, np.float32)
    run_op("IsNaN", [x])
    run_op("IsInf", [x], detect_negative=0)
    for op in ("GreaterOrEqual", "LessOrEqual"):
        run_op(op, [rnd(3, 11, seed=8), rnd(11, seed=9)])
        run_op(op, [rnd(3, 11, dtype=np.int32, seed=8), rnd(11, dtype=np.int32, seed=9)])


def test_mean_and_integer_pow():
    run_op("Mean", [rnd(3, 7, seed=1), rnd(7, seed=2), rnd(3, 1, seed=3)])
    base = rnd(4, 9, dtype=np.int64, lo=-1, hi=1, seed=4)
    run_op("Pow", [base, np.broadcast_to(np.arange(-2, 7, dtype=np.int64), (4, 9)).copy()])
    run_op("Pow", [base.astype(np.int32), np.full((4, 9), 3, np.int32)])
    big = np.array([3, -3, 7, 2, 5, -1, 0, 1], np.int64)  # wrapping results, the exponent's top bits
    run_op("Pow", [big, np.array([40, 41, 63, 64, 2**62 + 1, -(2**63), 0, 2**63 - 1], np.int64)])
    run_op("Pow", [big.astype(np.uint64), np.array([40, 2**64 - 1, 63, 64, 2**63 + 1, 5, 0, 2**64 - 1], np.uint64)])
