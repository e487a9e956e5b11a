"""MaxPool and AveragePool over (N, C, *spatial), 1 to 3 spatial dimensions.

Window taps are unrolled at emit time; out-of-range taps are masked with selects on a clamped
(always in-bounds) load, so the kernel never reads outside its input.
"""

from __future__ import annotations

import itertools
import math

from llvmlite import ir

from .. import irhelpers as h
from .base import KernelContext, kernel
from .reduce import _lowest, combine


def _pool(ctx: KernelContext, kind: str) -> None:
    shape, out_shape = ctx.shape(0), ctx.out_shape
    nd = len(shape) - 2
    a = ctx.attrs
    kernel_shape, strides, pads = a["kernel_shape"], a["strides"], a["pads"]
    dil = a.get("dilations", (1,) * nd)
    dtype = ctx.in_types[0].dtype
    ty = h.LLTYPE[dtype]
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    spatial, osp = shape[2:], out_shape[2:]
    in_plane, out_plane = math.prod(spatial), math.prod(osp)
    istr = h.contiguous_strides(spatial)
    with h.for_range(b, shape[0] * shape[1], name="nc") as nc:
        xb, yb = b.mul(nc, h.i64(in_plane)), b.mul(nc, h.i64(out_plane))
        with h.loop_nest(b, osp, name="o") as o:
            starts = [b.sub(b.mul(o[i], h.i64(strides[i])), h.i64(pads[i])) for i in range(nd)]
            acc = _lowest(dtype, ty) if kind == "max" else h.const(ty, 0.0)
            for taps in itertools.product(*(range(k) for k in kernel_shape)):
                ok: ir.Value = ir.Constant(h.I1, 1)
                off = xb
                for i, t in enumerate(taps):
                    p = b.add(starts[i], h.i64(t * dil[i]))
                    inside = b.and_(b.icmp_signed(">=", p, h.i64(0)), b.icmp_signed("<", p, h.i64(spatial[i])))
                    ok = b.and_(ok, inside)
                    off = b.add(off, b.mul(b.select(inside, p, h.i64(0)), h.i64(istr[i])))
                v = h.load(b, x, off)
                acc = b.select(ok, combine(b, kind, dtype, acc, v), acc)
            if kind == "avg":
                acc = b.fdiv(acc, _divisor(ctx, starts, ty))
            h.store(b, acc, y, b.add(yb, h.linear(b, o, h.contiguous_strides(osp))))


def _divisor(ctx: KernelContext, starts, ty) -> ir.Value:
    """Counted elements: per axis, the window clipped to the input (or input plus its pads)."""
    b, a = ctx.b, ctx.attrs
    spatial = ctx.shape(0)[2:]
    nd = len(spatial)
    count = h.i64(1)
    for i, s in enumerate(starts):
        lo, hi = (-a["pads"][i], spatial[i] + a["pads"][nd + i]) if a["count_include_pad"] else (0, spatial[i])
        end = b.add(s, h.i64(a["kernel_shape"][i]))
        end = b.select(b.icmp_signed("<", end, h.i64(hi)), end, h.i64(hi))
        beg = b.select(b.icmp_signed(">", s, h.i64(lo)), s, h.i64(lo))
        count = b.mul(count, b.sub(end, beg))
    return b.sitofp(count, ty)


@kernel("MaxPool")
def emit_max_pool(ctx: KernelContext) -> None:
    _pool(ctx, "max")


@kernel("AveragePool")
def emit_avg_pool(ctx: KernelContext) -> None:
    _pool(ctx, "avg")
