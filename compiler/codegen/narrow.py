"""Conversions to and from the storage-only dtypes (bfloat16, float8, float4, int4, int2), in f32.

Each narrow element is held as raw bits (one byte; bfloat16 two). Decoding is exact; encoding
rounds to nearest even and then does what ml_dtypes' ``astype`` does (the reference), which is
also ONNX's Cast with ``saturate=0``: a value beyond the largest finite one becomes infinity where
the format has one (float8e5m2), NaN where it has only NaN, the largest value where it has neither
(float4). ONNX's ``saturate=1`` (float8 only) first clamps to the largest finite value. Every
format constant is read from ml_dtypes itself, so nothing here restates a format's layout.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ..ir.dtypes import SATURABLE, DType
from . import irhelpers as h
from .halfprec import f64_to_f32_odd

I8, I32 = h.I8, h.I32
NARROW_INTS = {DType.I4: (4, True), DType.U4: (4, False), DType.I2: (2, True), DType.U2: (2, False)}
"""Bits and signedness of the narrow integers (held in the low bits of a byte, as ml_dtypes does)."""


@dataclass(frozen=True)
class FloatFormat:
    """A narrow float: its mantissa bits, smallest normal exponent, and the codes of its specials."""

    mant: int
    emin: int
    max: float
    max_code: int
    sign: int  # the sign bit's mask
    nan: int  # the code a NaN becomes
    overflow: int  # the code of a value beyond max (infinity, NaN or max)
    neg_zero: int  # the code of -0.0 (0 where the format has no negative zero)
    special_from: int  # magnitudes from here up are not finite (infinity or NaN)
    inf: int | None  # the magnitude code of infinity, if any
    nan_at_neg_zero: bool  # the sign bit alone is NaN (the "fnuz" formats)

    @property
    def bias(self) -> int:
        return 1 - self.emin


def _code(dtype: DType, v: float) -> int:
    return int(np.array([v], np.float32).astype(dtype.numpy).view(np.uint8)[0])


@functools.cache
def float_format(dtype: DType) -> FloatFormat:
    info = dtype.finfo
    sign = _code(dtype, -float(info.max)) ^ _code(dtype, float(info.max))
    codes = np.arange(sign, dtype=np.uint8).view(dtype.numpy).astype(np.float32)
    specials = [c for c in range(sign) if not np.isfinite(codes[c])]
    infs = [c for c in specials if np.isinf(codes[c])]
    negzero = np.array([sign], np.uint8).view(dtype.numpy).astype(np.float32)[0]
    return FloatFormat(int(info.nmant), int(info.minexp), float(info.max), _code(dtype, float(info.max)), sign,
                       _code(dtype, math.nan), _code(dtype, math.inf), _code(dtype, -0.0),
                       min(specials, default=sign), infs[0] if infs else None, bool(np.isnan(negzero)))


def _i32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def to_f32(b: ir.IRBuilder, x: ir.Value, src: DType) -> ir.Value:
    """A float value of any width, or an integer, as f32 rounded once (doubles through round-to-odd)."""
    if x.type == h.F32:
        return x
    if x.type == h.F64:
        return f64_to_f32_odd(b, x)
    if x.type == h.F16:
        return b.fpext(x, h.F32)
    wide = b.sitofp(x, h.F64) if src in h.SIGNED else b.uitofp(x, h.F64)
    return f64_to_f32_odd(b, wide)


# --- decoding --------------------------------------------------------------------------------------
def decode_float(b: ir.IRBuilder, raw: ir.Value, dtype: DType) -> ir.Value:
    """The f32 value of a narrow float's bits (exact)."""
    if dtype is DType.BF16:
        return b.bitcast(b.shl(b.zext(raw, I32), _i32(16)), h.F32)
    if dtype is DType.F8E8M0:  # 2**(c - 127); c = 0 is the f32 subnormal 2**-127; 0xFF is NaN
        c = b.zext(raw, I32)
        bits = b.select(b.icmp_unsigned("==", c, _i32(0)), _i32(0x400000), b.shl(c, _i32(23)))
        return b.select(b.icmp_unsigned("==", c, _i32(0xFF)), h.const(h.F32, math.nan), b.bitcast(bits, h.F32))
    f = float_format(dtype)
    c = b.zext(raw, I32)
    mag = b.and_(c, _i32(f.sign - 1))
    e = b.lshr(mag, _i32(f.mant))
    m = b.and_(mag, _i32((1 << f.mant) - 1))
    normal_bits = b.or_(b.shl(b.add(e, _i32(127 - f.bias)), _i32(23)), b.shl(m, _i32(23 - f.mant)))
    sub = b.fmul(b.uitofp(m, h.F32), h.const(h.F32, 2.0 ** (f.emin - f.mant)))
    v = b.select(b.icmp_unsigned("==", e, _i32(0)), sub, b.bitcast(normal_bits, h.F32))
    if f.inf is not None:
        v = b.select(b.icmp_unsigned("==", mag, _i32(f.inf)), h.const(h.F32, math.inf), v)
    nan = b.icmp_unsigned(">=", mag, _i32(f.special_from))
    if f.inf is not None:
        nan = b.and_(nan, b.icmp_unsigned("!=", mag, _i32(f.inf)))
    if f.nan_at_neg_zero:
        nan = b.or_(nan, b.icmp_unsigned("==", c, _i32(f.sign)))
    v = b.select(b.icmp_unsigned("!=", b.and_(c, _i32(f.sign)), _i32(0)), b.fneg(v), v)
    return b.select(nan, h.const(h.F32, math.nan), v)


def decode_int(b: ir.IRBuilder, raw: ir.Value, dtype: DType) -> ir.Value:
    """A narrow integer's value as an i8 (sign-extended from its bits where signed)."""
    bits, signed = NARROW_INTS[dtype]
    shift = ir.Constant(I8, 8 - bits)
    return b.ashr(b.shl(raw, shift), shift) if signed else b.and_(raw, ir.Constant(I8, (1 << bits) - 1))


# --- encoding --------------------------------------------------------------------------------------
def encode_float(b: ir.IRBuilder, x: ir.Value, dtype: DType, saturate: bool) -> ir.Value:
    """The bits of f32 ``x`` rounded to a narrow float (round to nearest even)."""
    if dtype is DType.BF16:
        bits = b.bitcast(x, I32)
        odd = b.and_(b.lshr(bits, _i32(16)), _i32(1))
        rounded = b.trunc(b.lshr(b.add(b.add(bits, _i32(0x7FFF)), odd), _i32(16)), h.I16)
        return b.select(b.fcmp_unordered("uno", x, x), ir.Constant(h.I16, 0x7FC0), rounded)
    f = float_format(dtype)
    if saturate and dtype in SATURABLE:  # NaN compares false and stays NaN
        top, bottom = h.const(h.F32, f.max), h.const(h.F32, -f.max)
        x = b.select(b.fcmp_ordered(">", x, top), top, b.select(b.fcmp_ordered("<", x, bottom), bottom, x))
    a = h.call_intrinsic(b, "llvm.fabs", x)
    shift = 23 - f.mant
    sub = b.fptoui(h.call_intrinsic(b, "llvm.rint", b.fmul(a, h.const(h.F32, 2.0 ** (f.mant - f.emin)))), I32)
    bits = b.bitcast(a, I32)
    rounded = b.add(b.add(bits, _i32((1 << (shift - 1)) - 1)), b.and_(b.lshr(bits, _i32(shift)), _i32(1)))
    normal = b.sub(b.lshr(rounded, _i32(shift)), _i32((127 - f.bias) << f.mant))
    is_sub = b.fcmp_ordered("<", a, h.const(h.F32, 2.0 ** f.emin))
    code = b.select(is_sub, sub, normal)
    negative = b.icmp_signed("<", b.bitcast(x, I32), _i32(0))
    out = b.select(negative, b.select(b.icmp_unsigned("==", code, _i32(0)), _i32(f.neg_zero), b.or_(code, _i32(f.sign))),
                   code)
    if f.overflow == f.nan:
        over = _i32(f.nan)
    else:  # infinity or the largest value, signed
        mag = f.overflow & (f.sign - 1)
        over = b.select(negative, _i32(mag | f.sign), _i32(mag))
    out = b.select(b.icmp_unsigned(">", code, _i32(f.max_code)), over, out)
    out = b.select(b.fcmp_unordered("uno", x, x), _i32(f.nan), out)
    return b.trunc(out, I8)


def encode_int(b: ir.IRBuilder, x: ir.Value, src: DType, dtype: DType) -> ir.Value:
    """A value as a narrow integer's bits: floats truncate toward zero and become 0 out of range
    or NaN (as ml_dtypes does); integers wrap."""
    bits, signed = NARROW_INTS[dtype]
    mask = ir.Constant(I8, (1 << bits) - 1)
    if not h.is_float(x.type):
        return b.and_(b.trunc(x, I8) if x.type.width > 8 else x, mask)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    t = h.call_intrinsic(b, "llvm.trunc", x)
    ok = b.and_(b.fcmp_ordered(">=", t, h.const(x.type, lo)), b.fcmp_ordered("<=", t, h.const(x.type, hi)))
    v = b.fptosi(b.select(ok, t, h.const(x.type, 0)), I8)
    return b.and_(v, mask)


# --- Cast's two halves -----------------------------------------------------------------------------
def decode(b: ir.IRBuilder, raw: ir.Value, dtype: DType) -> tuple[ir.Value, DType]:
    """A narrow element as a value of a computable dtype (f32, i8 or u8), and that dtype."""
    if dtype in NARROW_INTS:
        return decode_int(b, raw, dtype), DType.I8 if NARROW_INTS[dtype][1] else DType.U8
    return decode_float(b, raw, dtype), DType.F32


def encode_e8m0(b: ir.IRBuilder, x: ir.Value, saturate: bool, mode: str) -> ir.Value:
    """ONNX's float8e8m0 (the reference's ``_to_e8m0``): f32's exponent field, rounded by the mantissa."""
    bits = b.bitcast(x, I32)
    e = b.and_(b.lshr(bits, _i32(23)), _i32(0xFF))

    def any_bits(mask: int) -> ir.Value:
        return b.icmp_unsigned("!=", b.and_(bits, _i32(mask)), _i32(0))

    inc = {"up": lambda: any_bits(0x7FFFFF),
           "nearest": lambda: b.and_(any_bits(0x400000),
                                     b.or_(any_bits(0x3FFFFF), b.icmp_unsigned("!=", e, _i32(0)))),
           "down": lambda: ir.Constant(h.I1, 0)}[mode]()
    if saturate:
        inc = b.and_(inc, b.icmp_unsigned("!=", e, _i32(0xFE)))
    code = b.select(b.icmp_unsigned("==", e, _i32(0xFF)), e, b.add(e, b.zext(inc, I32)))
    return b.trunc(code, I8)


def encode(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType, saturate: bool, round_mode: str = "up") -> ir.Value:
    """A value of computable dtype ``src`` as the bits of narrow ``dst``."""
    if dst in NARROW_INTS:
        return encode_int(b, x, src, dst)
    if dst is DType.F8E8M0:  # from f64 to nearest f32 first, as the reference's float32 conversion
        return encode_e8m0(b, b.fptrunc(x, h.F32) if x.type == h.F64 else to_f32(b, x, src), saturate, round_mode)
    return encode_float(b, to_f32(b, x, src), dst, saturate)
