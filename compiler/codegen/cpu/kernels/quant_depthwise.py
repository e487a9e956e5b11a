"""Depthwise QConv with channels in vector lanes, for output planes too small for pixel vectors.

The per-channel loops of ``quant_grouped.py`` vectorize along an output row, which fills no vector
when the plane is small (MobileNetV2's 6x6 and 3x3 layers) and pays a plane copy per channel. Here the
input is copied once into a zero-bordered int16 plane of centred values in channel-last order
(``[row][col][channel]``, channels padded to whole vectors), so every tap of an output pixel is one
vector load per lane group, summed in int32 registers and requantized there; the lanes are stored to
their channel planes. Weights and bias are packed at compile time as int32 ``[tap][channel]`` and
``[channel]`` rows.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ....ops.quant import clamp_bounds
from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ...irhelpers import gep
from .base import KernelContext, KernelKey
from .quant_units import multipliers
from .quant_grouped import MAX_UNROLLED_TAPS, padded_dims

LANES = "dw-lanes"
I16 = ir.IntType(16)


def _lanes(target: Target) -> int:
    return target.vector_floats


def _channels_padded(c: int, target: Target) -> int:
    return -(-c // _lanes(target)) * _lanes(target)


def lanes_ok(key: KernelKey, target: Target) -> bool:
    """A depthwise conv (one output per input channel) whose output plane is small or whose output
    rows are short (the packer asks after the window-row quads, so the rows rule serves where those
    cannot: AVX2, 5x5 windows), with constant weights and bias (``key`` as the packer sees it)."""
    a = dict(key.attrs)
    if len(key.in_types[0].shape) != 4 or target.scalable or "const" != key.packed[1]:
        return False
    if len(key.in_types) == 3 and key.packed[2] != "const":
        return False
    _, c, _, _ = key.in_types[0].shape
    m, cg, kh, kw = key.in_types[1].shape
    oh, ow = key.out_types[0].shape[2:]
    t = target.tuning
    short = ow <= (t.int8_depthwise_lanes_max_width_strided if max(a["strides"]) > 1 else t.int8_depthwise_lanes_max_width)
    return cg == 1 and m == c == a["group"] and kh * kw <= MAX_UNROLLED_TAPS and c > 0 and (
        oh * ow <= t.int8_depthwise_lanes_max_pixels or short)


def pack_lanes(key: KernelKey, i: int, arr: np.ndarray, target: Target) -> tuple[str, np.ndarray] | None:
    """Weights as int32 ``[tap][channel]``, the bias as int32 ``[channel]``, channels padded."""
    cp = _channels_padded(key.in_types[0].shape[1], target)
    if i == 1:
        m, taps = arr.shape[0], math.prod(arr.shape[2:])
        out = np.zeros((taps, cp), np.int32)
        out[:, :m] = arr.reshape(m, taps).T
        return LANES, out
    if i == 2:
        out = np.zeros(cp, np.int32)
        out[: arr.size] = arr
        return LANES, out
    return None


def lanes_scratch(key: KernelKey, target: Target) -> int:
    rows, cols, _, _ = padded_dims(key)
    return -(-2 * rows * cols * _channels_padded(key.in_types[0].shape[1], target) // 64) * 64 + 64


def fill_centred(ctx: KernelContext, n: ir.Value, plane: ir.Value, cp: int,
                 dims: tuple[int, int, int, int]) -> None:
    """Image ``n``, centred, into the channel-last zero-bordered int16 plane of ``dims``
    (rows, cols, top pad, left pad), ``cp`` channels to a place: blocks of 16 channels x 16 columns
    transposed in registers, the rest one value at a time."""
    b = ctx.b
    _, c, hh, ww = ctx.shape(0)
    rows, cols, top, left = dims
    h.memset0(b, plane, 2 * rows * cols * cp)
    src = b.mul(n, h.i64(c * hh * ww))
    base = (top * cols + left) * cp
    cv, xv = c // BLOCK * BLOCK, ww // BLOCK * BLOCK
    if cv and xv:
        _fill_blocks(ctx, src, plane, cp, cols, base, cv, xv)
    xz = h.const(h.I32, ctx.attrs["x_zero_point"])

    def scalar(x0: int, c0: int, c1: int) -> None:
        """Columns ``x0..``, channels ``c0..c1``."""
        if x0 >= ww or c0 >= c1:
            return
        with h.loop_nest(b, (hh, ww - x0, c1 - c0), name="cp") as (iy, ix, ch):
            ix, ch = b.add(ix, h.i64(x0)), b.add(ch, h.i64(c0))
            v = qm.widen(b, h.load(b, ctx.ins[0], b.add(src, h.linear(b, (ch, iy, ix), (hh * ww, ww, 1)))),
                         ctx.in_types[0].dtype)
            h.store(b, b.trunc(b.sub(v, xz), I16), plane, h.linear(b, (iy, ix, ch), (cols * cp, cp, 1), base=base))

    if cv and xv:
        scalar(xv, 0, cv)
        scalar(0, cv, c)
    else:
        scalar(0, 0, c)


BLOCK = 16  # channels and columns of a register transpose: 16 byte vectors


def _transpose(b: ir.IRBuilder, vs: list) -> list:
    """16 ``<16 x i8>`` rows to their 16 columns: four rounds of interleaving row i with row i + 8."""
    lo = [j // 2 + (j % 2) * BLOCK for j in range(BLOCK)]
    hi = [k + BLOCK // 2 for k in lo]
    mask = ir.VectorType(h.I32, BLOCK)
    for _ in range(4):
        vs = [b.shuffle_vector(vs[i // 2], vs[i // 2 + 8], h.vector(mask, hi if i % 2 else lo)) for i in range(BLOCK)]
    return vs


def _fill_blocks(ctx: KernelContext, src: ir.Value, plane: ir.Value, cp: int, cols: int, base: int, cv: int,
                 xv: int) -> None:
    """Channels ``..cv`` x columns ``..xv`` of every row: 16 loads of 16 columns, a transpose, 16
    widened stores of 16 channels."""
    b = ctx.b
    _, _, hh, ww = ctx.shape(0)
    v8, v16 = ir.VectorType(h.I8, BLOCK), ir.VectorType(I16, BLOCK)
    xz = h.const(v16, ctx.attrs["x_zero_point"])
    signed = ctx.in_types[0].dtype in h.SIGNED
    with h.loop_nest(b, (hh, cv // BLOCK, xv // BLOCK), name="cpv") as (iy, cg, xb):
        x0, c0 = b.mul(xb, h.i64(BLOCK)), b.mul(cg, h.i64(BLOCK))
        at = b.add(src, h.linear(b, (c0, iy, x0), (hh * ww, ww, 1)))
        vs = [b.load(b.bitcast(gep(b, ctx.ins[0], b.add(at, h.i64(ch * hh * ww))), v8.as_pointer()), align=1)
              for ch in range(BLOCK)]
        out = b.add(h.linear(b, (iy, x0), (cols * cp, cp), base=base), c0)
        for j, v in enumerate(_transpose(b, vs)):
            wide = b.sub(b.sext(v, v16) if signed else b.zext(v, v16), xz)
            b.store(wide, b.bitcast(gep(b, plane, b.add(out, h.i64(j * cp))), v16.as_pointer()), align=2)


def emit_lanes_qconv(ctx: KernelContext) -> None:
    a, b = ctx.attrs, ctx.b
    n_img, c, _, _ = ctx.shape(0)
    _, _, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    _, cols, _, _ = padded_dims(ctx.key)
    vl, cp = _lanes(ctx.target), _channels_padded(c, ctx.target)
    vt, v16, ft = ir.VectorType(h.I32, vl), ir.VectorType(I16, vl), ir.VectorType(h.F32, vl)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mtab, m_one = multipliers(ctx, pad=cp)
    plane = b.bitcast(ctx.scratch, I16.as_pointer())
    weights = b.bitcast(ctx.ins[1], h.I32.as_pointer())
    bias = b.bitcast(ctx.ins[2], h.I32.as_pointer()) if len(ctx.in_types) == 3 else None
    origins = [(ty * dh * cols + tx * dw) * cp for ty in range(kh) for tx in range(kw)]

    def vload(ptr: ir.Value, index: ir.Value, t: ir.VectorType) -> ir.Value:
        return b.load(b.bitcast(gep(b, ptr, index), t.as_pointer()), align=2)

    def group(ch: ir.Value, at: ir.Value, out_px: ir.Value, valid: int) -> None:
        """Channels ``ch .. ch + vl`` of one output pixel (the first ``valid`` of them stored)."""
        acc = vload(bias, ch, vt) if bias is not None else h.vector(vt, None)
        for t, origin in enumerate(origins):
            x = b.sext(vload(plane, b.add(at, b.add(ch, h.i64(origin))), v16), vt)
            acc = b.add(acc, b.mul(x, vload(weights, b.add(ch, h.i64(t * cp)), vt)))
        mult = vload(mtab, ch, ft) if mtab is not None else h.const(ft, m_one)
        q = qm.requantize(b, acc, mult, a["y_zero_point"], lo, hi)
        for lane in range(valid):
            dst = b.add(b.mul(b.add(ch, h.i64(lane)), h.i64(oh * ow)), out_px)
            h.store(b, b.extract_element(q, ir.Constant(h.I32, lane)), ctx.outs[0], dst)

    with h.for_range(b, n_img, name="n") as n:
        fill_centred(ctx, n, plane, cp, padded_dims(ctx.key))
        img = b.mul(n, h.i64(c * oh * ow))
        with h.loop_nest(b, (oh, ow), name="px") as (oy, ox):
            at = h.linear(b, (oy, ox), (sh * cols * cp, sw * cp))
            out_px = b.add(img, h.linear(b, (oy, ox), (ow, 1)))
            full = (c // vl) * vl
            if full:
                with h.for_range(b, full, step=vl, name="cv") as ch:
                    group(ch, at, out_px, vl)
            if c % vl:
                group(h.i64(full), at, out_px, c % vl)
