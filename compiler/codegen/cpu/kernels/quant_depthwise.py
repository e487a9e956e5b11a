"""Depthwise QConv with channels in vector lanes, for output planes too small for pixel vectors.

The per-channel loops of ``quant_grouped.py`` vectorize along an output row, which fills no vector
when the plane is small (MobileNetV2's 6x6 and 3x3 layers) and pays a plane copy per channel. Here the
input is copied, 16 channels at a time (a step's lanes where wider), into a zero-bordered int16 plane of
centred values in channel-last order (``[row][col][channel]``), so every tap of an output pixel is one
vector load per lane group, summed in int32 registers and requantized there; the lanes are stored to
their channel planes, and the next group's channels are copied into the same plane. One plane of every
channel (MobileNetV2's stride-2 96-channel layer at 96x96: 96 x 50 x 50 int16, 480 KB) outgrew Zen 3's 512 KiB
L2 between the copy and the taps; by groups (80 KB) that layer took 0.65x the cycles, the 6x6 and 3x3 layers
0.72-0.85x (Zen 3, x86-avx2 host). Weights and bias are packed at compile time as int32 ``[tap][channel]`` and
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
from ..int_gemm import store_lanes
from .base import KernelContext, KernelKey
from .quant_units import multipliers
from .quant_grouped import MAX_UNROLLED_TAPS, padded_dims
from .quant_pairs import PAIR_ORDER, pair_madd, requantized, tap_pairs

LANES = "dw-lanes"
I16 = ir.IntType(16)


def _lanes(target: Target) -> int:
    return target.vector_floats


def _group(target: Target) -> int:
    """Channels a step computes: 16 with tap pairs, else a vector's lanes."""
    return BLOCK if tap_pairs(target) else _lanes(target)


def _channels_padded(c: int, target: Target) -> int:
    return -(-c // _group(target)) * _group(target)


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
    """Weights as int32 ``[tap][channel]`` (with tap pairs: int16 ``[pair][16 channels][2 halves][8 channels]
    [2 taps]``, ``PAIR_ORDER``'s channels, an odd last tap paired with zeros), the bias as int32 ``[channel]``,
    channels padded."""
    cp = _channels_padded(key.in_types[0].shape[1], target)
    if i == 1:
        m, taps = arr.shape[0], math.prod(arr.shape[2:])
        out = np.zeros((taps, cp), np.int32)
        out[:, :m] = arr.reshape(m, taps).T
        if not tap_pairs(target):
            return LANES, out
        pairs = np.zeros((-(-taps // 2) * 2, cp), np.int16)
        pairs[:taps] = out
        pairs = pairs.reshape(-1, 2, cp // BLOCK, BLOCK)  # [pair][tap][group][channel]
        order = np.array(PAIR_ORDER)  # [half][8 channels]
        return LANES, np.ascontiguousarray(pairs[:, :, :, order].transpose(0, 2, 3, 4, 1))
    if i == 2:
        out = np.zeros(cp, np.int32)
        out[: arr.size] = arr
        return LANES, out
    return None


def _plane_channels(c: int, target: Target) -> int:
    """Channels a plane holds: one group of 16 (or a step's lanes, where wider) at a time."""
    return min(_channels_padded(c, target), max(BLOCK, _group(target)))


def lanes_scratch(key: KernelKey, target: Target) -> int:
    rows, cols, _, _ = padded_dims(key)
    return -(-2 * rows * cols * _plane_channels(key.in_types[0].shape[1], target) // 64) * 64 + 64


def fill_centred(ctx: KernelContext, n: ir.Value, plane: ir.Value, cp: int,
                 dims: tuple[int, int, int, int], first: ir.Value | None = None, count: int | None = None,
                 clear: bool = True) -> None:
    """Image ``n``, centred, into the channel-last zero-bordered int16 plane of ``dims``
    (rows, cols, top pad, left pad), ``cp`` channels to a place: blocks of 16 channels x 16 columns
    transposed in registers, the rest one value at a time. ``first``, ``count``: only those channels
    (the plane's places hold channels ``first ..``), else all; ``clear``: zero the plane first (its border:
    a plane that held other channels of the image has it zero still)."""
    b = ctx.b
    _, c, hh, ww = ctx.shape(0)
    rows, cols, top, left = dims
    if clear:
        h.memset0(b, plane, 2 * rows * cols * cp)
    src = b.mul(n, h.i64(c * hh * ww))
    if first is not None:
        src, c = b.add(src, b.mul(first, h.i64(hh * ww))), count
    base = (top * cols + left) * cp
    cv, xv = c // BLOCK * BLOCK, ww // BLOCK * BLOCK
    if cv and xv:
        _fill_blocks(ctx, src, plane, cp, cols, base, cv, xv)
    elif cv:
        _fill_pixel_blocks(ctx, src, plane, cp, cols, base, cv)
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


def _fill_pixel_blocks(ctx: KernelContext, src: ir.Value, plane: ir.Value, cp: int, cols: int, base: int,
                       cv: int) -> None:
    """Channels ``..cv`` of a plane whose rows are under 16 columns (MobileNetV2's 6x6 and 3x3): blocks of 16
    channels x 16 pixels of the flattened plane (the last block's loads masked to the plane), a transpose, and
    each pixel's 16 channels widened to their place. One value at a time, the fill cost more than the conv:
    576 channels at 6x6 took 2.1x ONNX Runtime's time for the layer."""
    b = ctx.b
    _, _, hh, ww = ctx.shape(0)
    pixels = hh * ww
    v8, v16 = ir.VectorType(h.I8, BLOCK), ir.VectorType(I16, BLOCK)
    xz = h.const(v16, ctx.attrs["x_zero_point"])
    signed = ctx.in_types[0].dtype in h.SIGNED
    full, rest = divmod(pixels, BLOCK)
    with h.for_range(b, cv // BLOCK, name="cpg") as cg:
        c0 = b.mul(cg, h.i64(BLOCK))
        at = b.add(src, b.mul(c0, h.i64(pixels)))

        def block(p0: ir.Value, count: int) -> None:
            mask = h.vector(ir.VectorType(h.I1, BLOCK), [int(j < count) for j in range(BLOCK)])
            vs = []
            for ch in range(BLOCK):
                ptr = b.bitcast(gep(b, ctx.ins[0], b.add(at, b.add(p0, h.i64(ch * pixels)))), v8.as_pointer())
                vs.append(b.load(ptr, align=1) if count == BLOCK else h.masked_load(b, ptr, v8, mask, 1))
            for j, v in enumerate(_transpose(b, vs)[:count]):
                px = b.add(p0, h.i64(j))
                iy, ix = b.udiv(px, h.i64(ww)), b.urem(px, h.i64(ww))
                out = b.add(h.linear(b, (iy, ix), (cols * cp, cp), base=base), c0)
                wide = b.sub(b.sext(v, v16) if signed else b.zext(v, v16), xz)
                b.store(wide, b.bitcast(gep(b, plane, out), v16.as_pointer()), align=2)

        if full:
            with h.for_range(b, full, name="pxb") as pb:
                block(b.mul(pb, h.i64(BLOCK)), BLOCK)
        if rest:
            block(h.i64(full * BLOCK), rest)


def emit_lanes_qconv(ctx: KernelContext) -> None:
    a, b = ctx.attrs, ctx.b
    n_img, c, _, _ = ctx.shape(0)
    _, _, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    _, cols, _, _ = padded_dims(ctx.key)
    vl, step = _lanes(ctx.target), _group(ctx.target)
    cp = _channels_padded(c, ctx.target)  # the packed weights' and multipliers' channels
    gp = _plane_channels(c, ctx.target)  # the plane's: each group of gp channels is copied, then convolved
    vt, v16, ft = ir.VectorType(h.I32, vl), ir.VectorType(I16, vl), ir.VectorType(h.F32, vl)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mtab, m_one = multipliers(ctx, pad=cp)
    plane = b.bitcast(ctx.scratch, I16.as_pointer())
    weights = b.bitcast(ctx.ins[1], h.I32.as_pointer())
    bias = b.bitcast(ctx.ins[2], h.I32.as_pointer()) if len(ctx.in_types) == 3 else None
    origins = [(ty * dh * cols + tx * dw) * gp for ty in range(kh) for tx in range(kw)]

    def vload(ptr: ir.Value, index: ir.Value, t: ir.VectorType) -> ir.Value:
        return b.load(b.bitcast(gep(b, ptr, index), t.as_pointer()), align=2)

    def finish(ch: ir.Value, acc: ir.Value) -> ir.Value:
        """Channels ``ch .. ch + vl``' int32 sums plus their bias, requantized."""
        if bias is not None:
            acc = b.add(acc, vload(bias, ch, vt))
        mult = vload(mtab, ch, ft) if mtab is not None else h.const(ft, m_one)
        return qm.requantize(b, acc, mult, a["y_zero_point"], lo, hi)

    def sums(ch: ir.Value, at: ir.Value) -> ir.Value:
        """Channels ``ch .. ch + step`` of the output pixel whose window starts at plane index ``at``, requantized."""
        if tap_pairs(ctx.target):
            return pair_sums(ch, at)
        acc = h.vector(vt, None)
        for t, origin in enumerate(origins):
            x = b.sext(vload(plane, b.add(at, b.add(ch, h.i64(origin))), v16), vt)
            acc = b.add(acc, b.mul(x, vload(weights, b.add(ch, h.i64(t * cp)), vt)))
        return finish(ch, acc)

    def pair_sums(ch: ir.Value, at: ir.Value) -> ir.Value:
        """``sums`` by tap pairs (``quant_pairs.py``) over 16 channels."""
        x16, p16 = ir.VectorType(I16, BLOCK), ir.VectorType(I16, 2 * vl)
        w16 = b.bitcast(ctx.ins[1], I16.as_pointer())
        halves = [h.vector(vt, None), h.vector(vt, None)]
        for pair in range(-(-len(origins) // 2)):
            xs = [b.load(b.bitcast(gep(b, plane, b.add(at, b.add(ch, h.i64(o)))), x16.as_pointer()), align=2)
                  for o in origins[2 * pair:2 * pair + 2]]  # an odd last tap pairs with itself, its partner's weights zero
            ws = [vload(w16, b.add(b.mul(ch, h.i64(2)), h.i64(pair * 2 * cp + half * 2 * vl)), p16) for half in (0, 1)]
            halves = pair_madd(b, halves, xs[0], xs[-1], ws)
        return requantized(b, halves, lambda k, s: finish(b.add(ch, h.i64(k * vl)), s))

    def window(px: ir.Value, g0: ir.Value) -> ir.Value:
        """Where output pixel ``px``'s window starts in the plane of the group from channel ``g0``, less ``g0``
        (``sums`` adds its channel)."""
        oy, ox = b.udiv(px, h.i64(ow)), b.urem(px, h.i64(ow))
        return b.sub(h.linear(b, (oy, ox), (sh * cols * gp, sw * gp)), g0)

    def group(ch: ir.Value, g0: ir.Value, img: ir.Value, px: ir.Value, valid: int) -> None:
        """Channels ``ch .. ch + vl`` of output pixel ``px`` (the first ``valid`` of them stored)."""
        q = sums(ch, window(px, g0))
        for lane in range(valid):
            dst = b.add(b.add(img, b.mul(b.add(ch, h.i64(lane)), h.i64(oh * ow))), px)
            h.store(b, b.extract_element(q, ir.Constant(h.I32, lane)), ctx.outs[0], dst)

    def transposed(ch: ir.Value, img: ir.Value, p0: ir.Value, count: int, channels: int = BLOCK) -> None:
        """The first ``channels`` of channels ``ch .. ch + 16`` of output pixels ``p0 .. p0 + count``: their bytes
        transposed in registers to 16 pixels a channel, one store each (a byte store per lane cost the
        960-channel 3x3 layers half their time)."""
        qs = [sums(ch, window(b.add(p0, h.i64(j)), ch)) for j in range(count)]
        for k, row in enumerate(_transpose(b, qs + [h.vector(qs[0].type, None)] * (BLOCK - count))[:channels]):
            ptr = gep(b, ctx.outs[0], b.add(b.add(img, b.mul(b.add(ch, h.i64(k)), h.i64(oh * ow))), p0))
            store_lanes(b, row, ptr, None if count == BLOCK else count, ctx.target.tuning.masked_stores)

    def channel_block(ch: ir.Value, img: ir.Value, channels: int) -> None:
        if pixels >= BLOCK:
            with h.for_range(b, pixels // BLOCK, name="pxb") as pb:
                transposed(ch, img, b.mul(pb, h.i64(BLOCK)), BLOCK, channels)
        if pixels % BLOCK:
            transposed(ch, img, h.i64(pixels // BLOCK * BLOCK), pixels % BLOCK, channels)

    def plane_group(n: ir.Value, img: ir.Value, g0: ir.Value, count: int) -> None:
        """Channels ``g0 .. g0 + count`` (at most ``gp``): copied into the plane, then convolved while it is in cache."""
        fill_centred(ctx, n, plane, gp, dims, g0, count, clear=False)
        if step == BLOCK:  # 16 channels a step, stored through the transpose; a partial last one's padding unstored
            channel_block(g0, img, count)
            return
        with h.for_range(b, pixels, name="px") as px:
            for k in range(0, count, vl):
                group(b.add(g0, h.i64(k)), g0, img, px, min(vl, count - k))

    pixels, full, dims = oh * ow, (c // gp) * gp, padded_dims(ctx.key)
    h.memset0(b, plane, 2 * dims[0] * dims[1] * gp)  # the border: no group or image writes it
    with h.for_range(b, n_img, name="n") as n:
        img = b.mul(n, h.i64(c * pixels))
        if full:
            with h.for_range(b, full, step=gp, name="cg") as g0:
                plane_group(n, img, g0, gp)
        if c % gp:
            plane_group(n, img, h.i64(full), c % gp)
