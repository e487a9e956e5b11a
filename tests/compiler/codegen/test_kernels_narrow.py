"""Cast to and from the storage-only dtypes (bfloat16, float8, float4, int4, int2), natively and in
the reference interpreter, against ml_dtypes and ONNX's own ``saturate_cast`` (bit for bit)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx.numpy_helper import saturate_cast

import tests.compiler.codegen.test_kernels as tk
from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.errors import ShapeError
from cuvil.compiler.frontends.builder import GraphBuilder

FLOAT8 = [DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ]
NARROW_FLOATS = [*FLOAT8, DType.F4E2M1, DType.BF16]
NARROW_INTS = [DType.I4, DType.U4, DType.I2, DType.U2]


def _cast(x: np.ndarray, to: DType, **attrs) -> tuple[np.ndarray, np.ndarray]:
    """(native, reference) results of one Cast."""
    gb = GraphBuilder("narrow_cast")
    name = gb.input("x", TensorType(DType.from_numpy(x.dtype), x.shape))
    graph = gb.build(gb.add("Cast", [name], to=to, **attrs))
    out = graph.outputs[0]
    got = tk.compile_graph(graph, optimize=False).run({name: x})[out]
    return got, run_reference(graph, {name: x})[out]


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bits, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    assert np.isnan(got.astype(np.float32)[nan]).all()
    width = np.uint16 if want.dtype.itemsize == 2 else np.uint8
    np.testing.assert_array_equal(got.view(width)[~nan], want.view(width)[~nan])


def _edges(dtype: DType) -> np.ndarray:
    """Every value of the format, the midpoints between neighbours (ties), one f32 ulp either side
    of them, overflow, tiny values, infinities and NaN."""
    values = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint16 if dtype.itemsize == 2 else np.uint8)
    finite = np.unique(values.view(dtype.numpy).astype(np.float32))
    finite = finite[np.isfinite(finite)]
    mid = finite[1:] / 2 + finite[:-1] / 2
    big = float(ml_dtypes.finfo(dtype.numpy).max)
    extra = [min(big * 1.03, 3e38), min(big * 1.3, 3.3e38), 1e30, 1e-30, 1e-45, np.inf, -np.inf, np.nan, 0.0, -0.0]
    return np.concatenate([finite, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf),
                           np.array(extra, np.float32)]).astype(np.float32)


@pytest.mark.parametrize("dtype", NARROW_FLOATS, ids=lambda d: d.value)
@pytest.mark.parametrize("saturate", [0, 1])
def test_float_to_narrow_float_rounds_to_nearest_even(dtype, saturate):
    x = _edges(dtype)
    got, ref = _cast(x, dtype, saturate=saturate)
    with np.errstate(all="ignore"):
        want = saturate_cast(x, dtype.numpy) if saturate and dtype in FLOAT8 else x.astype(dtype.numpy)
    _same_bits(got, want)
    _same_bits(ref, want)


@pytest.mark.parametrize("dtype", NARROW_FLOATS, ids=lambda d: d.value)
@pytest.mark.parametrize("to", [np.float32, np.float16, np.float64, np.int32])
def test_narrow_float_to_wide_is_exact(dtype, to):
    raw = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint16 if dtype.itemsize == 2 else np.uint8)
    raw = raw[::7] if dtype.itemsize == 2 else raw
    x = raw.view(dtype.numpy) if dtype is not DType.F4E2M1 else (raw & 0xF).view(dtype.numpy)
    if to is np.int32:
        x = x[np.isfinite(x.astype(np.float32)) & (np.abs(x.astype(np.float32)) < 2**31)]
    got, ref = _cast(x, DType.from_numpy(to))
    with np.errstate(all="ignore"):
        want = x.astype(np.float32).astype(to)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref, want)


def test_half_and_double_to_float8_round_once():
    """From f16 and f64 directly: the same bits as rounding the exact value once."""
    x64 = np.concatenate([_edges(DType.F8E4M3FN).astype(np.float64) * (1 + 2.0**-40), [1.0625 + 2.0**-30]])
    with np.errstate(over="ignore"):
        x16 = _edges(DType.F8E5M2).astype(np.float16)
    for x in (x64, x16):
        got, _ = _cast(x, DType.F8E4M3FN, saturate=1)
        with np.errstate(all="ignore"):
            _same_bits(got, saturate_cast(x, ml_dtypes.float8_e4m3fn))


@pytest.mark.parametrize("dtype", NARROW_INTS, ids=lambda d: d.value)
def test_narrow_ints_both_ways(dtype):
    f = np.concatenate([np.arange(-20, 20, 0.5), [np.nan, np.inf, -np.inf, 1e10]]).astype(np.float32)
    i = np.arange(-300, 300, 7, dtype=np.int32)
    for x in (f, i, i.astype(np.int8), np.array([True, False])):
        got, ref = _cast(x, dtype)
        with np.errstate(all="ignore"):
            want = x.astype(dtype.numpy)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        np.testing.assert_array_equal(ref.view(np.uint8), want.view(np.uint8))
    codes = np.arange(1 << int(dtype.value[1:]), dtype=np.uint8).view(dtype.numpy)
    for to in (np.float32, np.int8, np.float16):
        got, _ = _cast(codes, DType.from_numpy(to))
        np.testing.assert_array_equal(got, codes.astype(to))


def test_narrow_to_narrow_goes_through_the_wide_value():
    x = np.arange(-8, 8, dtype=np.int8).astype(ml_dtypes.int4)
    got, ref = _cast(x, DType.F8E4M3FN)
    _same_bits(got, x.astype(np.float32).astype(ml_dtypes.float8_e4m3fn))


def test_arithmetic_on_storage_only_dtypes_is_refused():
    gb = GraphBuilder("narrow_add")
    x = gb.input("x", TensorType(DType.F8E4M3FN, (3,)))
    with pytest.raises(ShapeError, match="storage-only"):
        gb.build(gb.add("Add", [x, x]))


@pytest.mark.parametrize("x,to", [
    (np.array([1.5, -0.0, np.inf, np.nan], np.float32), DType.I32),
    (np.array(3.25, np.float32), DType.U32),
    (np.arange(-4, 4, dtype=np.int16).view(np.float16), DType.BF16),
    (np.arange(0, 256, 5, dtype=np.uint8), DType.F8E4M3FN),
    (np.arange(-8, 8, dtype=np.int8).astype(ml_dtypes.int4), DType.U4),
    (np.array([True, False]), DType.U8),
])
def test_bitcast_keeps_the_bytes(x, to):
    gb = GraphBuilder("bitcast")
    name = gb.input("x", TensorType(DType.from_numpy(x.dtype), x.shape))
    graph = gb.build(gb.add("BitCast", [name], to=to))
    got = tk.compile_graph(graph, optimize=False).run({name: x})[graph.outputs[0]]
    want = x.copy().view(to.numpy)
    assert got.dtype == want.dtype and got.shape == x.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("src,to", [(DType.I32, DType.F16), (DType.I8, DType.I4), (DType.U8, DType.BOOL)])
def test_bitcast_refuses_other_widths_and_bool(src, to):
    gb = GraphBuilder("bitcast")
    x = gb.input("x", TensorType(src, (3,)))
    with pytest.raises(ShapeError, match="BitCast"):
        gb.build(gb.add("BitCast", [x], to=to))


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8e8m0_rounds_the_exponent_as_onnx(mode, saturate):
    from onnx.numpy_helper import to_float8e8m0

    p = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    x = np.concatenate([p, p * 1.25, p * 1.5, p * 1.75, np.nextafter(p, 0), -p * 1.5, [0.0, -0.0, np.inf, -np.inf, np.nan,
                        np.finfo(np.float32).max]]).astype(np.float32)
    got, ref = _cast(x, DType.F8E8M0, saturate=saturate, round_mode=mode)
    want = to_float8e8m0(x, bool(saturate), mode)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(ref.view(np.uint8), want.view(np.uint8))
    half = x[np.abs(x) < 60000].astype(np.float16)
    got, _ = _cast(half, DType.F8E8M0, saturate=saturate, round_mode=mode)
    np.testing.assert_array_equal(got.view(np.uint8), to_float8e8m0(half, bool(saturate), mode).view(np.uint8))


def test_float8e8m0_decodes_every_code():
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    got, ref = _cast(codes, DType.F32)
    np.testing.assert_array_equal(got, codes.astype(np.float32))
    np.testing.assert_array_equal(ref, codes.astype(np.float32))
