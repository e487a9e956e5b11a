"""QConv without the GEMM: grouped and depthwise convs, and weights given at run time.

Per output channel, an int32 plane accumulates ``(x - zp) * w`` tap by tap; each input channel is
first copied into a zero-bordered int16 plane of centred values, so the tap loops need no bounds
checks and the loop over output columns is a plain vector stream (contiguous at stride 1).
"""

from __future__ import annotations

from llvmlite import ir

from ....ops.quant import clamp_bounds, multiplier
from ... import irhelpers as h
from ... import quant_math as qm
from .base import KernelContext, KernelKey

I16 = ir.IntType(16)


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


def emit_grouped_qconv(ctx: KernelContext) -> None:
    a, b = ctx.attrs, ctx.b
    n_img, c, hh, ww = ctx.shape(0)
    m, cg, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw), g = a["strides"], a["dilations"], a["group"]
    rows, cols, top, left = _padded_dims(ctx.key)
    mg = m // g
    dtype = ctx.in_types[0].dtype
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mvals = multiplier(a["x_scale"], a["w_scale"], a["y_scale"])
    xz = h.const(h.I32, a["x_zero_point"])
    plane = b.bitcast(ctx.scratch, I16.as_pointer())
    acc = h.byte_ptr(b, ctx.scratch, _plane_bytes(ctx.key), h.I32)
    memset = h.intrinsic(b.module, "llvm.memset.p0i8.i64", h.VOID, [h.I8P, h.I8, h.I64, h.I1])
    with h.loop_nest(b, (n_img, m)) as (n, oc):
        init = h.load(b, ctx.ins[2], oc) if len(ctx.in_types) == 3 else h.const(h.I32, 0)
        with h.for_range(b, oh * ow, name="z") as p:
            h.store(b, init, acc, p)
        ch0 = b.mul(b.udiv(oc, h.i64(mg)), h.i64(cg))
        with h.for_range(b, cg, name="ic") as ic:
            b.call(memset, [ctx.scratch, ir.Constant(h.I8, 0), h.i64(2 * rows * cols), ir.Constant(h.I1, 0)])
            src = b.mul(b.add(b.mul(n, h.i64(c)), b.add(ch0, ic)), h.i64(hh * ww))
            with h.loop_nest(b, (hh, ww), name="cp") as (iy, ix):
                v = qm.widen(b, h.load(b, ctx.ins[0], b.add(src, h.linear(b, (iy, ix), (ww, 1)))), dtype)
                dst = h.linear(b, (iy, ix), (cols, 1), base=top * cols + left)
                h.store(b, b.trunc(b.sub(v, xz), I16), plane, dst)
            wbase = b.mul(b.add(b.mul(oc, h.i64(cg)), ic), h.i64(kh * kw))
            with h.loop_nest(b, (kh, kw), name="tap") as (ty, tx):  # one vector loop for every tap
                wv = b.sext(h.load(b, ctx.ins[1], b.add(wbase, h.linear(b, (ty, tx), (kw, 1)))), h.I32)
                origin = h.linear(b, (ty, tx), (dh * cols, dw))
                with h.loop_nest(b, (oh, ow), name="t") as (oy, ox):
                    x = b.sext(h.load(b, plane, h.linear(b, (oy, ox), (sh * cols, sw), base=origin)), h.I32)
                    out = h.linear(b, (oy, ox), (ow, 1))
                    h.store(b, b.add(h.load(b, acc, out), b.mul(x, wv)), acc, out)
        mult = qm.channel_value(b, mvals, h.F32, oc, f"{ctx.name}.m")
        base = b.mul(b.add(b.mul(n, h.i64(m)), oc), h.i64(oh * ow))
        with h.for_range(b, oh * ow, name="rq") as p:
            q = qm.requantize(b, h.load(b, acc, p), mult, a["y_zero_point"], lo, hi)
            h.store(b, q, ctx.outs[0], b.add(base, p))
