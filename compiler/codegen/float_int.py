"""Float -> integer conversion exactly as the reference's ``astype`` gives it on x86-64, on every CPU.

LLVM's ``fptosi``/``fptoui`` are poison out of range (every negative value, for ``fptoui``), and
CPUs then differ: x86 gives its "integer indefinite" (the minimum), ARM's ``fcvtz*`` saturates. So
only in-range values reach them here; explicit compares and selects give the rest. With
``t = trunc(x)`` and ``S_n(x)`` = t where -2^(n-1) <= t < 2^(n-1), else -2^(n-1) (NaN, +-inf and
out of range: x86's integer indefinite), the reference (NumPy; ml_dtypes for the narrow floats)
gives, checked over every 16-bit and narrower value and sampled f32/f64 boundaries:

=============  ==================  ============================================================
source         target              result
=============  ==================  ============================================================
f16 f32 f64    i64, i32            S_64(x), S_32(x)
f16 f32 f64    i16 i8 u16 u8       S_32(x) wrapped (NaN, +-inf -> 0; -2.7 -> u8 254)
f32 f64        u32                 x >= 2^31: S_32(x - 2^31) xor 2^31, else S_32(x) wrapped
                                   (2^32 and +inf -> 0; NaN, -inf, -3e9 -> 2^31)
f16            u32                 S_64(x) wrapped (NaN, +-inf -> 0)
f16 f32 f64    u64                 x >= 2^63: S_64(x - 2^63) xor 2^63, else S_64(x) wrapped
                                   (-7 -> 2^64 - 7; 2^64 and +inf -> 0; NaN, -inf -> 2^63)
bf16 f8 f4     any                 t where it fits the target, else 0 (NaN, +-inf included)
=============  ==================  ============================================================
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.dtypes import DType
from . import irhelpers as h


def _indefinite(b: ir.IRBuilder, x: ir.Value, ity: ir.IntType) -> ir.Value:
    """S_n(x): the truncated value where ``fptosi`` defines it, the type's minimum elsewhere."""
    lo = h.const(x.type, -2.0 ** (ity.width - 1))
    t = h.call_intrinsic(b, "llvm.trunc", x)
    ok = b.and_(b.fcmp_ordered(">=", t, lo), b.fcmp_ordered("<", t, h.const(x.type, 2.0 ** (ity.width - 1))))
    return b.fptosi(b.select(ok, t, lo), ity)


def _unsigned_full_width(b: ir.IRBuilder, x: ir.Value, ity: ir.IntType) -> ir.Value:
    """x86 compilers' conversion to an unsigned type as wide as the signed one used: above the signed
    range, convert x - 2^(n-1) and flip the top bit (an out-of-range value's minimum flips to 0)."""
    half = h.const(x.type, 2.0 ** (ity.width - 1))
    big = b.fcmp_ordered(">=", x, half)
    v = _indefinite(b, b.select(big, b.fsub(x, half), x), ity)
    return b.select(big, b.xor(v, ir.Constant(ity, -(1 << (ity.width - 1)))), v)


def _fits_or_zero(b: ir.IRBuilder, x: ir.Value, signed: bool, ity: ir.IntType) -> ir.Value:
    """ml_dtypes' conversion: the truncated value where the target holds it, else 0."""
    n = ity.width
    lo, hi = (-2.0 ** (n - 1), 2.0 ** (n - 1)) if signed else (0.0, 2.0 ** n)
    t = h.call_intrinsic(b, "llvm.trunc", x)
    ok = b.and_(b.fcmp_ordered(">=", t, h.const(x.type, lo)), b.fcmp_ordered("<", t, h.const(x.type, hi)))
    return (b.fptosi if signed else b.fptoui)(b.select(ok, t, h.const(x.type, 0.0)), ity)


def float_to_int(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """``x`` (of float dtype ``src``, already decoded to f32 when ``src`` is narrow) as ``dst``,
    by the module's table."""
    ity = h.LLTYPE[dst]
    if x.type == h.F16:  # exact, and f16 cannot hold 2^31
        x = b.fpext(x, h.F32)
    if src.is_narrow:
        return _fits_or_zero(b, x, dst in h.SIGNED, ity)
    if dst is DType.U64 or (dst is DType.U32 and src is not DType.F16):
        return _unsigned_full_width(b, x, ity)
    wide = h.I64 if ity.width == 64 or dst is DType.U32 else h.I32
    v = _indefinite(b, x, wide)
    return v if wide.width == ity.width else b.trunc(v, ity)
