"""GridSample's per-element code (an entry of ``gathers.PER_ELEMENT``): the taps of each axis from the
grid's coordinates, read at run time, mirroring ``ops.resample``'s reference step by step.

Every tap index is clamped into the axis before it is read and masked when it falls outside, so a
hostile grid (NaN, infinities, huge values) reads nothing outside X; the coordinate is clamped to a
few pixels around the axis before it becomes an integer (``fptosi`` of NaN or 1e30 is poison).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from llvmlite import ir

from ..ir.dtypes import DType
from ..ir.types import TensorType
from ..ops.resample import grid_border
from . import irhelpers as h
from .halfprec import float_convert

_REACH = 8.0  # pixels beyond an axis a coordinate keeps: cubic taps reach 2, so outside stays outside


def _fmin(b, x, y):
    return h.call_intrinsic(b, "llvm.minnum", x, y)


def _fmax(b, x, y):
    return h.call_intrinsic(b, "llvm.maxnum", x, y)


def _reflect(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """``ops.resample.grid_reflect`` on one coordinate."""
    t = x.type
    if hi == lo:
        return h.const(t, lo)
    span = hi - lo
    below = b.fcmp_ordered("<", x, h.const(t, lo))
    d = b.select(below, b.fsub(h.const(t, lo), x), b.fsub(x, h.const(t, hi)))
    k = h.call_intrinsic(b, "llvm.trunc", b.fdiv(d, h.const(t, span)))
    r = b.fsub(d, b.fmul(k, h.const(t, span)))
    half = h.call_intrinsic(b, "llvm.floor", b.fmul(k, h.const(t, 0.5)))
    even = b.fcmp_ordered("==", b.fsub(k, b.fmul(half, h.const(t, 2.0))), h.const(t, 0.0))
    mirrored = b.select(b.icmp_unsigned("==", below, even), b.fadd(h.const(t, lo), r), b.fsub(h.const(t, hi), r))
    inside = b.and_(b.fcmp_ordered(">=", x, h.const(t, lo)), b.fcmp_ordered("<=", x, h.const(t, hi)))
    return b.select(inside, x, mirrored)


def _cubic(b: ir.IRBuilder, t: ir.Value, a: float = -0.75) -> list[ir.Value]:
    """``ops.resample.cubic_weights`` for one fraction."""
    c = lambda v: h.const(t.type, v)  # noqa: E731

    def far(u):  # ((a u - 5a) u + 8a) u - 4a
        return b.fsub(b.fmul(b.fadd(b.fmul(b.fsub(b.fmul(c(a), u), c(5 * a)), u), c(8 * a)), u), c(4 * a))

    def near(u):  # ((a + 2) u - (a + 3)) u u + 1
        return b.fadd(b.fmul(b.fmul(b.fsub(b.fmul(c(a + 2), u), c(a + 3)), u), u), c(1.0))

    one_minus = b.fsub(c(1.0), t)
    return [far(b.fadd(t, c(1.0))), near(t), near(one_minus), far(b.fsub(c(2.0), t))]


def grid_sample(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]):
    """y[n, c, o] = sum over the product of the axes' taps of weight * X[n, c, tap] (0 outside X
    with zeros padding); in f32, f64 for f64 data."""
    xs, gs = tuple(ins[0].shape), tuple(ins[1].shape)
    spatial, r = xs[2:], len(xs) - 2
    xst, gst = h.contiguous_strides(xs), h.contiguous_strides(gs)
    dtype = outs[0].dtype
    acc = h.F64 if dtype is DType.F64 else h.F32
    mode, padding, align = a["mode"], a["padding_mode"], a["align_corners"]

    def axis_taps(b, g, n):
        """(inside, index, weight or None) of each tap along an axis of ``n`` pixels."""
        c = lambda v: h.const(acc, v)  # noqa: E731
        lo, hi = grid_border(n, align)
        x = b.fmul(b.fadd(g, c(1.0)), c((n - 1) / 2)) if align else \
            b.fmul(b.fsub(b.fmul(b.fadd(g, c(1.0)), c(float(n))), c(1.0)), c(0.5))
        if mode == "nearest":
            x = h.call_intrinsic(b, "llvm.rint", x)
        if padding == "border" and mode != "cubic":
            out = b.or_(b.fcmp_ordered("<", x, c(lo)), b.fcmp_ordered(">", x, c(hi)))
            x = b.select(out, _fmin(b, _fmax(b, x, c(0.0)), c(n - 1.0)), x)
        elif padding == "reflection":
            x = _reflect(b, x, lo, hi)
        x = _fmin(b, _fmax(b, x, c(-_REACH)), c(n + _REACH))  # maxnum(NaN, v) is v
        if mode == "nearest":
            taps = [(h.call_intrinsic(b, "llvm.trunc", x), None)]
        else:
            f = h.call_intrinsic(b, "llvm.floor", x)
            t = b.fsub(x, f)
            weights = [b.fsub(c(1.0), t), t] if mode == "linear" else _cubic(b, t)
            first = 0 if mode == "linear" else -1
            taps = [(b.fadd(f, c(float(first + k))), w) for k, w in enumerate(weights)]
        out = []
        for i, w in taps:
            if padding == "border":
                i = _fmin(b, _fmax(b, i, c(0.0)), c(n - 1.0))
            elif padding == "reflection":
                i = h.call_intrinsic(b, "llvm.trunc", _reflect(b, i, lo, hi))
            j = b.fptosi(i, h.I64)  # i is within [-REACH - 2, n + REACH + 2]: defined
            inside = b.icmp_unsigned("<", j, h.i64(n))
            out.append((inside, b.select(inside, j, h.i64(0)), w))
        return out

    def value(b, idx, ptrs):
        n, ch, pos = idx[0], idx[1], idx[2:]
        gbase = h.linear(b, [n, *pos], gst[:-1])
        per_axis = []
        for d in range(r):
            g = float_convert(b, h.load(b, ptrs[1], b.add(gbase, h.i64(r - 1 - d))), acc)
            per_axis.append(axis_taps(b, g, spatial[d]))
        base = h.linear(b, [n, ch], xst[:2])
        total = h.const(acc, 0.0)
        for combo in itertools.product(*per_axis):
            inside = ir.Constant(h.I1, 1)
            at = base
            for d, (ok, j, _) in enumerate(combo):
                inside = b.and_(inside, ok)
                at = b.add(at, b.mul(j, h.i64(xst[2 + d])))
            v = float_convert(b, h.load(b, ptrs[0], at), acc)
            for _, _, w in combo:
                if w is not None:
                    v = b.fmul(v, w)
            total = b.fadd(total, b.select(inside, v, h.const(acc, 0.0)))
        return float_convert(b, total, h.LLTYPE[dtype])

    return value
