"""The generic pool loop, for what ``pool.py``'s vector paths do not take: other dtypes, 3-D pools,
windows too big to unroll. Taps are unrolled (a run-time loop over more than ``MAX_UNROLLED_TAPS``),
out-of-range taps masked with selects on a clamped (always in-bounds) load.
"""

from __future__ import annotations

import itertools
import math

from llvmlite import ir

from ....ir.dtypes import DType
from ... import irhelpers as h
from .base import KernelContext
from .reduce import combine, lowest

MAX_UNROLLED_TAPS = 64


def window_count(b: ir.IRBuilder, start: ir.Value, k: int, lo: int, hi: int) -> ir.Value:
    """``min(start + k, hi) - max(start, lo)`` in i64, at run time."""
    end = b.add(start, h.i64(k))
    end = b.select(b.icmp_signed("<", end, h.i64(hi)), end, h.i64(hi))
    return b.sub(end, b.select(b.icmp_signed(">", start, h.i64(lo)), start, h.i64(lo)))


def emit_generic_pool(ctx: KernelContext, kind: str) -> None:
    """Any pool ``kind`` (``max``, ``avg``) of any dtype and rank, one output element at a time."""
    shape, out_shape = ctx.shape(0), ctx.out_shape
    nd = len(shape) - 2
    a = ctx.attrs
    kernel_shape, strides, pads = a["kernel_shape"], a["strides"], a["pads"]
    dil = a.get("dilations", (1,) * nd)
    dtype = ctx.in_types[0].dtype
    ty = h.LLTYPE[dtype]
    wide = kind == "avg" and dtype is DType.F16  # f16 windows summed in f32, rounded once, as the reference
    acc_ty = h.F32 if wide else ty
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    spatial, osp = shape[2:], out_shape[2:]
    in_plane, out_plane = math.prod(spatial), math.prod(osp)
    istr = h.contiguous_strides(spatial)
    with h.for_range(b, shape[0] * shape[1], name="nc") as nc:
        xb, yb = b.mul(nc, h.i64(in_plane)), b.mul(nc, h.i64(out_plane))
        with h.loop_nest(b, osp, name="o") as o:
            starts = [b.sub(b.mul(o[i], h.i64(strides[i])), h.i64(pads[i])) for i in range(nd)]
            def tap(acc: ir.Value, taps) -> ir.Value:  # taps: one offset per axis, ints or i64 values
                ok: ir.Value = ir.Constant(h.I1, 1)
                off = xb
                for i, t in enumerate(taps):
                    p = b.add(starts[i], b.mul(t, h.i64(dil[i])) if isinstance(t, ir.Value) else h.i64(t * dil[i]))
                    inside = b.and_(b.icmp_signed(">=", p, h.i64(0)), b.icmp_signed("<", p, h.i64(spatial[i])))
                    ok = b.and_(ok, inside)
                    off = b.add(off, b.mul(b.select(inside, p, h.i64(0)), h.i64(istr[i])))
                v = h.load(b, x, off)
                return b.select(ok, combine(b, kind, dtype, acc, b.fpext(v, h.F32) if wide else v), acc)

            acc = lowest(dtype, ty) if kind == "max" else h.const(acc_ty, 0.0)
            if math.prod(kernel_shape) <= MAX_UNROLLED_TAPS:
                for taps in itertools.product(*(range(k) for k in kernel_shape)):
                    acc = tap(acc, taps)
            else:
                kst = h.contiguous_strides(kernel_shape)
                acc = h.reduce_range(b, math.prod(kernel_shape), acc, lambda a_, r: tap(a_, [
                    b.urem(b.udiv(r, h.i64(st)), h.i64(k)) for st, k in zip(kst, kernel_shape)]), name="tap")
            if kind == "avg":  # counted: per axis, the window clipped to the input (or input plus pads)
                count = h.i64(1)
                for i, st in enumerate(starts):
                    lo, hi = (-pads[i], spatial[i] + pads[nd + i]) if a["count_include_pad"] else (0, spatial[i])
                    count = b.mul(count, window_count(b, st, kernel_shape[i], lo, hi))
                acc = b.fdiv(acc, b.sitofp(count, acc_ty))
            h.store(b, b.fptrunc(acc, ty) if wide else acc, y, b.add(yb, h.linear(b, o, h.contiguous_strides(osp))))
