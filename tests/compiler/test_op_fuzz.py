"""The native-vs-reference op fuzzer (``op_fuzz.py``) with a seeded budget, natively and under qemu,
and the cases it once found, each with values written out by hand.

Every admitted case must end in the reference's values or, where the reference refuses, a typed
refusal at run time; a crash, an untyped error or a difference is a finding that fails the test.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from cuvil.compiler import DType
from cuvil.compiler.errors import RunTimeCheckError

from tests.compiler import op_fuzz as fz
from tests.compiler import op_fuzz_cases as cases

NATIVE_CASES = 1500  # about a minute on one core
QEMU_CASES = 150  # one qemu process per 40 cases
WIDE_CAST_CASES = 400


def _report(findings) -> str:
    return "\n".join(f"{b.case.describe()}: {why}"[:400] for b, why in findings[:20])


def test_seeded_fuzz_native_matches_the_reference(tmp_path):
    findings, cases, _ = fz.fuzz(np.random.default_rng(20261201), NATIVE_CASES, fz.native_runner(tmp_path))
    assert len(cases) == NATIVE_CASES
    assert {b.case.op for b in cases} == set(fz.GENERATORS)
    assert not findings, f"{len(findings)} findings:\n{_report(findings)}"


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                    reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")
def test_seeded_fuzz_under_qemu_matches_the_reference(tmp_path):
    findings, cases, _ = fz.fuzz(np.random.default_rng(7), QEMU_CASES, fz.emulated_runner(tmp_path, "rpi5"))
    assert len(cases) == QEMU_CASES
    assert not findings, f"{len(findings)} findings:\n{_report(findings)}"


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                    reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")
@pytest.mark.parametrize("profile", ["graviton4", "arm64-sve2"])
def test_integer_gemms_fuzzed_under_qemu_on_i8mm_and_sve(profile, tmp_path):
    """QConv and QMatMul shapes drawn at random through the smmla (graviton4) and SVE sdot (arm64-sve2,
    256-bit registers) GEMMs."""
    findings, cases, _ = fz.fuzz(np.random.default_rng(3), 80, fz.emulated_runner(tmp_path, profile),
                                 ops=["QMatMul", "QConv"])
    assert len(cases) == 80
    assert not findings, f"{len(findings)} findings:\n{_report(findings)}"


WIDE_CAST = {"Cast": lambda rng: cases.cast(rng, cases.ANY + cases.WIDE_INTS)}
"""Casts between every plain dtype, i16, u16, u32 and u64 included (negative floats to u64 wrapped wrongly)."""


def test_casts_between_every_integer_width_fuzzed_natively(tmp_path):
    findings, drawn, _ = fz.fuzz(np.random.default_rng(5), WIDE_CAST_CASES, fz.native_runner(tmp_path),
                                 generators=WIDE_CAST)
    assert {b.case.attrs["to"] for b in drawn} >= {DType.I16, DType.U16, DType.U32, DType.U64}
    assert not findings, f"{len(findings)} findings:\n{_report(findings)}"


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                    reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")
def test_casts_between_every_integer_width_fuzzed_under_qemu(tmp_path):
    findings, _, _ = fz.fuzz(np.random.default_rng(6), WIDE_CAST_CASES, fz.emulated_runner(tmp_path, "rpi5"),
                             generators=WIDE_CAST)
    assert not findings, f"{len(findings)} findings:\n{_report(findings)}"


def _native(case: fz.Case, feeds=None) -> dict[str, np.ndarray]:
    built = fz.build(case, "r")
    assert built is not None, "the verifier refuses the case"
    kind, detail = fz.native_runner(None)([built])
    assert kind == "outputs", detail
    return next(iter(detail.values()))


def _i(values, dtype):
    return ("x", np.array(values, dtype), False)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_division_by_zero_and_the_one_overflow(dtype):
    lo = np.iinfo(dtype).min
    got = _native(fz.Case("Div", [_i([7, -7, 7, -7, 5, lo, lo], dtype), _i([2, 2, -2, 0, 0, -1, 1], dtype)]))
    np.testing.assert_array_equal(got, np.array([3, -3, -3, 0, 0, lo, lo], dtype))
    got = _native(fz.Case("Div", [_i([200, 7], np.uint8), _i([0, 2], np.uint8)]))
    np.testing.assert_array_equal(got, np.array([0, 3], np.uint8))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_integer_mod_of_min_by_minus_one_is_zero(dtype, fmod):
    """x86 idiv traps on MIN % -1 (SIGFPE killed the process); the reference and ONNX Runtime give 0."""
    lo = np.iinfo(dtype).min
    got = _native(fz.Case("Mod", [_i([lo, lo, 7, -7, lo, 5], dtype), _i([-1, -1, -1, -1, 0, -3], dtype)], {"fmod": fmod}))
    np.testing.assert_array_equal(got, np.array([0, 0, 0, 0, 0, 2 if fmod else -1], dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_pow_wraps_and_truncates_negative_exponents(dtype):
    lo = np.iinfo(dtype).min
    got = _native(fz.Case("Pow", [_i([3, -2, 2, 1, -1, -1, 5, 0, 2], dtype), _i([4, 3, -1, -7, -3, lo, 0, 0, 7], dtype)]))
    np.testing.assert_array_equal(got, np.array([81, -8, 0, 1, -1, 1, 1, 1, 128 if dtype is not np.int8 else -128],
                                                dtype))
    got = _native(fz.Case("Pow", [_i([2, 3], np.uint8), _i([9, 5], np.uint8)]))
    np.testing.assert_array_equal(got, np.array([0, 243], np.uint8))  # 512 and 243 modulo 256


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_pow_special_values_are_c_pow(dtype):
    inf, nan = np.inf, np.nan
    x = [1, 1, -1, -inf, -inf, -inf, -inf, 0, -2, -2, 2, 0.5]
    y = [nan, inf, -inf, 0.5, -0.5, 3, -3, -1, 0.5, 2, -inf, -inf]
    got = _native(fz.Case("Pow", [_i(x, dtype), _i(y, dtype)]))
    want = np.array([1, 1, 1, inf, 0, -inf, -0.0, inf, nan, 4, 0, inf], dtype)
    np.testing.assert_array_equal(got, want)
    assert np.signbit(got[6])


def test_global_average_pool_of_an_empty_plane_is_nan():
    got = _native(fz.Case("GlobalAveragePool", [("x", np.ones((1, 2, 3, 0), np.float32), False)]))
    assert got.shape == (1, 2, 1, 1) and np.isnan(got).all()


def test_batch_norm_in_half_precision():
    x = np.array([[1.0, 2.0], [3.0, -4.0]], np.float16)
    ones, zeros = np.ones(2, np.float16), np.zeros(2, np.float16)
    case = fz.Case("BatchNormalization", [("x", x, False), ("s", np.array([2, 1], np.float16), True),
                                          ("b", np.array([0.5, 0], np.float16), True), ("m", zeros, True),
                                          ("v", ones, True)])
    np.testing.assert_allclose(_native(case), np.array([[2.5, 2.0], [6.5, -4.0]], np.float16), rtol=2e-3)


def test_gemm_and_qconv_with_empty_dims():
    got = _native(fz.Case("Gemm", [("a", np.ones((0, 2), np.float32), False), ("b", np.ones((1, 2), np.float32), True),
                                   ("c", np.ones(1, np.float32), True)], {"transB": 1}))
    assert got.shape == (0, 1)
    qconv = fz.Case("QConv", [("x", np.ones((1, 0, 1, 3), np.int8), False), ("w", np.ones((3, 0, 1, 2), np.int8), True),
                              ("b", np.array([1, 2, 3], np.int32), True)],
                    {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1, "x_scale": 1.0,
                     "x_zero_point": 0, "w_scale": (1.0,), "y_scale": 1.0, "y_zero_point": 0, "to": DType.I8,
                     "clamp": ()})
    np.testing.assert_array_equal(_native(qconv), np.array([1, 2, 3], np.int8).reshape(1, 3, 1, 1) * np.ones((1, 1, 1, 2),
                                                                                                          np.int8))


def test_qmatmul_with_a_bias_computed_at_run_time():
    a = np.array([[1, 2], [3, 4]], np.int8)
    w = np.array([[1, 0, 2], [0, 1, -1]], np.int8)
    case = fz.Case("QMatMul", [("a", a, False), ("w", w, True), ("b", np.array([10, 20, 30], np.int32), False)],
                   {"a_scale": 1.0, "a_zero_point": 0, "b_scale": (1.0, 0.5, 1.0), "y_scale": 1.0, "y_zero_point": 0,
                    "to": DType.I8, "clamp": ()})
    # (a @ w + bias) * (a_scale * b_scale / y_scale), rounded half to even
    np.testing.assert_array_equal(_native(case), np.array([[11, 11, 30], [13, 12, 32]], np.int8))


def test_gather_outside_its_axis_is_refused_as_the_reference_refuses():
    case = fz.Case("Gather", [("x", np.zeros((3, 0, 1 << 20), np.float32), False), ("i", np.array([0]), True)],
                   {"axis": 1})
    built = fz.build(case, "g")
    assert built.ref is None and "out of range" in built.ref_error
    kind, detail = fz.native_runner(None)([built])
    assert kind == "refused" and RunTimeCheckError.__name__ in detail


def test_integer_resize_whose_nearest_tap_is_excluded_matches_the_reference():
    case = fz.Case("Resize", [("x", np.arange(64, dtype=np.uint8).reshape(2, 4, 2, 4), False)],
                   {"sizes": (5, -1, -1, 5), "scales": (2.5, 1.0, 1.0, 1.25), "roi": (), "mode": "nearest",
                    "coordinate_transformation_mode": "half_pixel_symmetric", "nearest_mode": "ceil",
                    "exclude_outside": 1, "antialias": 0, "extrapolation_value": -1.5})
    built = fz.build(case, "r")
    kind, detail = fz.native_runner(None)([built])
    assert kind == "outputs", detail
    np.testing.assert_array_equal(next(iter(detail.values())), built.ref[0])


@pytest.mark.parametrize("case", [
    fz.Case("Resize", [("x", np.zeros((0, 3), np.float32), False)], {"sizes": (4, -1), "scales": (2.0, 1.0)}),
    fz.Case("Resize", [("x", np.zeros((4, 3), np.float32), False)], {"sizes": (0, -1), "scales": (0.5, 1.0)}),
    fz.Case("ConvTranspose", [("x", np.zeros((1, 2, 0), np.float32), False), ("w", np.zeros((2, 1, 3), np.float32), True)],
            {"strides": (2,), "pads": (0, 0), "dilations": (1,), "output_padding": (1,)}),
], ids=["resize_from_empty", "resize_to_empty", "conv_transpose_of_empty"])
def test_resampling_an_empty_axis_is_refused_by_the_verifier(case):
    """The reference's taps and ConvTranspose's output size count from an input position that does not exist."""
    assert fz.build(case, "e") is None


def test_gather_elements_refuses_indices_outside_the_axis_and_reads_a_smaller_index_box():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    case = fz.Case("GatherElements", [("x", data, False), ("i", np.array([[2, -1], [0, 1]]), False)], {"axis": 0})
    np.testing.assert_array_equal(_native(case), np.array([[8, 9], [0, 5]], np.float32))  # data[idx[i, j], j]
    for bad, shape, axis in (([[3, 0]], (3, 4), 0), ([[0]], (3, 0), 1)):
        built = fz.build(fz.Case("GatherElements", [("x", np.zeros(shape, np.float32), False),
                                                    ("i", np.array(bad), False)], {"axis": axis}), "g")
        assert built.ref is None
        kind, detail = fz.native_runner(None)([built])
        assert kind == "refused" and RunTimeCheckError.__name__ in detail


def test_exclusive_cumsum_past_an_infinity_and_argmax_of_nan():
    x = np.array([np.inf, 1.0, 2.0], np.float32)
    got = _native(fz.Case("CumSum", [("x", x, False)], {"axis": 0, "exclusive": 1}))
    np.testing.assert_array_equal(got, np.array([0, np.inf, np.inf], np.float32))
    y = np.array([[1.0, np.nan, 3.0, np.nan]], np.float32)
    for last, want in ((0, 1), (1, 3)):
        got = _native(fz.Case("ArgMax", [("x", y, False)], {"axis": 1, "keepdims": 0, "select_last_index": last}))
        assert got.tolist() == [want]


def test_a_reduction_to_a_scalar_compiles():
    """Its accumulator slot was put at the entry block's start, which shifted the builder: invalid IR."""
    got = _native(fz.Case("ReduceMin", [("x", np.array([[3], [1], [2]], np.uint8), False)], {"axes": (0, 1), "keepdims": 0}))
    assert got.tolist() == 1
