"""QConv without the GEMM: grouped and depthwise convs, and weights given at run time.

Each input channel is first copied into a zero-bordered int16 plane of centred values ``x - zp``, so
the tap loops need no bounds checks and the loop over output columns is a plain vector stream
(contiguous at stride 1). A depthwise conv (one input channel per output) sums every tap of an
output pixel in registers and requantizes it there; with more input channels per group, an int32
plane accumulates channel by channel, tap by tap.
"""

from __future__ import annotations

from llvmlite import ir

from ....ops.quant import clamp_bounds, multiplier
from ... import irhelpers as h
from ... import quant_math as qm
from .base import KernelContext, KernelKey

I16 = ir.IntType(16)
MAX_UNROLLED_TAPS = 64  # a depthwise window up to 8x8 is summed by straight-line code


def _padded_dims(key: KernelKey) -> tuple[int, int, int, int]:
    """(rows, cols, top pad, left pad) of the bordered plane: every tap of every output inside."""
    a = dict(key.attrs)
    _, _, hh, ww = key.in_types[0].shape
    _, _, kh, kw = key.in_types[1].shape
    oh, ow = key.out_types[0].shape[2:]
    (sh, sw), (dh, dw), pads = a["strides"], a["dilations"], a["pads"]
    rows = max(hh + pads[0], (oh - 1) * sh + (kh - 1) * dh + 1)
    cols = max(ww + pads[1], (ow - 1) * sw + (kw - 1) * dw + 1)
    return rows, cols, pads[0], pads[1]


def _plane_bytes(key: KernelKey) -> int:
    rows, cols, _, _ = _padded_dims(key)
    return -(-2 * rows * cols // 64) * 64


def grouped_scratch(key: KernelKey) -> int:
    oh, ow = key.out_types[0].shape[2:]
    return _plane_bytes(key) + 4 * oh * ow + 64


def _fill_plane(ctx: KernelContext, n: ir.Value, channel: ir.Value, plane: ir.Value) -> None:
    """Input channel ``channel`` of image ``n``, centred, into the zero-bordered int16 plane."""
    b = ctx.b
    _, c, hh, ww = ctx.shape(0)
    rows, cols, top, left = _padded_dims(ctx.key)
    memset = h.intrinsic(b.module, "llvm.memset.p0i8.i64", h.VOID, [h.I8P, h.I8, h.I64, h.I1])
    b.call(memset, [ctx.scratch, ir.Constant(h.I8, 0), h.i64(2 * rows * cols), ir.Constant(h.I1, 0)])
    xz = h.const(h.I32, ctx.attrs["x_zero_point"])
    src = b.mul(b.add(b.mul(n, h.i64(c)), channel), h.i64(hh * ww))
    with h.loop_nest(b, (hh, ww), name="cp") as (iy, ix):
        v = qm.widen(b, h.load(b, ctx.ins[0], b.add(src, h.linear(b, (iy, ix), (ww, 1)))), ctx.in_types[0].dtype)
        h.store(b, b.trunc(b.sub(v, xz), I16), plane, h.linear(b, (iy, ix), (cols, 1), base=top * cols + left))


def emit_grouped_qconv(ctx: KernelContext) -> None:
    a, b = ctx.attrs, ctx.b
    n_img, _, _, _ = ctx.shape(0)
    m, cg, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw), g = a["strides"], a["dilations"], a["group"]
    _, cols, _, _ = _padded_dims(ctx.key)
    mg = m // g
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mvals = multiplier(a["x_scale"], a["w_scale"], a["y_scale"])
    plane = b.bitcast(ctx.scratch, I16.as_pointer())
    acc = h.byte_ptr(b, ctx.scratch, _plane_bytes(ctx.key), h.I32)
    depthwise = cg == 1 and kh * kw <= MAX_UNROLLED_TAPS
    with h.loop_nest(b, (n_img, m)) as (n, oc):
        init = h.load(b, ctx.ins[2], oc) if len(ctx.in_types) == 3 else h.const(h.I32, 0)
        mult = qm.channel_value(b, mvals, h.F32, oc, f"{ctx.name}.m")
        base = b.mul(b.add(b.mul(n, h.i64(m)), oc), h.i64(oh * ow))
        ch0 = b.mul(b.udiv(oc, h.i64(mg)), h.i64(cg))
        if depthwise:
            _fill_plane(ctx, n, ch0, plane)
            wbase = b.mul(oc, h.i64(kh * kw))
            taps = [(b.sext(h.load(b, ctx.ins[1], b.add(wbase, h.i64(ty * kw + tx))), h.I32), ty * dh * cols + tx * dw)
                    for ty in range(kh) for tx in range(kw)]
            with h.loop_nest(b, (oh, ow), name="t") as (oy, ox):
                at = h.linear(b, (oy, ox), (sh * cols, sw))
                total = init
                for wv, origin in taps:
                    x = b.sext(h.load(b, plane, b.add(at, h.i64(origin))), h.I32)
                    total = b.add(total, b.mul(x, wv))
                q = qm.requantize(b, total, mult, a["y_zero_point"], lo, hi)
                h.store(b, q, ctx.outs[0], b.add(base, h.linear(b, (oy, ox), (ow, 1))))
        else:
            _accumulate_channels(ctx, n, oc, ch0, plane, acc, init)
            with h.for_range(b, oh * ow, name="rq") as p:
                q = qm.requantize(b, h.load(b, acc, p), mult, a["y_zero_point"], lo, hi)
                h.store(b, q, ctx.outs[0], b.add(base, p))


def _accumulate_channels(ctx: KernelContext, n, oc, ch0, plane, acc, init) -> None:
    """The int32 plane of output channel ``oc``: its bias, plus every tap of every input channel."""
    a, b = ctx.attrs, ctx.b
    _, cg, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    _, cols, _, _ = _padded_dims(ctx.key)
    with h.for_range(b, oh * ow, name="z") as p:
        h.store(b, init, acc, p)
    with h.for_range(b, cg, name="ic") as ic:
        _fill_plane(ctx, n, b.add(ch0, ic), plane)
        wbase = b.mul(b.add(b.mul(oc, h.i64(cg)), ic), h.i64(kh * kw))
        with h.loop_nest(b, (kh, kw), name="tap") as (ty, tx):  # one vector loop for every tap
            wv = b.sext(h.load(b, ctx.ins[1], b.add(wbase, h.linear(b, (ty, tx), (kw, 1)))), h.I32)
            origin = h.linear(b, (ty, tx), (dh * cols, dw))
            with h.loop_nest(b, (oh, ow), name="t") as (oy, ox):
                x = b.sext(h.load(b, plane, h.linear(b, (oy, ox), (sh * cols, sw), base=origin)), h.I32)
                out = h.linear(b, (oy, ox), (ow, 1))
                h.store(b, b.add(h.load(b, acc, out), b.mul(x, wv)), acc, out)
