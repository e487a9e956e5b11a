"""QConv with fewer input channels than a dot-product unit: neighbouring taps of a kernel row share a unit.

The im2col GEMM of ``quant.py`` orders K as (tap, channel unit): a conv over one input channel (a
raw-waveform front conv, 80 taps at stride 4) pads each tap's unit with zero points, so three of
every four products are wasted. Here K runs (kernel row, unit) where a unit holds ``per_unit``
consecutive (tap column, channel) pairs of that row, so an 80-tap, one-channel conv has 20 quads
instead of 80. The im2col builds each unit from the input bytes (zero points outside the image);
which output columns read only inside the image is known when compiling, so only the border runs
check bounds.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ... import irhelpers as h
from ..int_dot import Dot
from ..int_gemm import GemmGeometry, padded_cols
from ...irhelpers import gep
from .base import KernelContext, KernelKey
from .quant_grouped import valid_span

TAPS = "qtaps:"  # + the Dot kind the packing was made for
ALIGN = 64


def row_units(key: KernelKey, per_unit: int) -> int:
    """Units per kernel row: its (tap column, channel) pairs in groups of ``per_unit``."""
    c, kw = key.in_types[1].shape[1], key.in_types[1].shape[3]
    return -(-kw * c // per_unit)


def taps_ok(key: KernelKey, per_unit: int) -> bool:
    """One group, 2-D, fewer channels than a unit, and fewer units than one per tap."""
    a = dict(key.attrs)
    if a["group"] != 1 or len(key.in_types[0].shape) != 4:
        return False
    c, kw = key.in_types[1].shape[1], key.in_types[1].shape[3]
    return 0 < c < per_unit and row_units(key, per_unit) < kw


def taps_rows(arr: np.ndarray, per_unit: int) -> np.ndarray:
    """Weights [M, C, KH, KW] as rows with K ordered (kernel row, tap column, channel), rows padded to units."""
    m, c, kh, kw = arr.shape
    units = -(-kw * c // per_unit)
    rows = np.zeros((m, kh, units * per_unit), np.int16)
    rows[:, :, : kw * c] = arr.transpose(0, 2, 3, 1).reshape(m, kh, kw * c)
    return rows.reshape(m, kh * units * per_unit)


def taps_geometry(key: KernelKey, dot: Dot) -> GemmGeometry:
    m, _, kh, _ = key.in_types[1].shape
    p = math.prod(key.out_types[0].shape[2:])
    return GemmGeometry(rows=m, cols=p, cols_pad=padded_cols(p, dot), k4=kh * row_units(key, dot.per_unit), vec_is_u=True)


def taps_scratch(key: KernelKey, dot: Dot) -> int:
    geo = taps_geometry(key, dot)
    return 4 * geo.k4 * geo.cols_pad + ALIGN


def emit_taps_im2col(ctx: KernelContext, dot: Dot, n: ir.Value, flip: bool, fill: int, word_fill: ir.Value) -> ir.Value:
    """cols[row * units + u][p] = unit u of kernel row ``row`` at output pixel p, in scratch; an ``i8*``.
    ``fill`` is the encoded zero point, ``word_fill`` a unit of it."""
    a, b = ctx.attrs, ctx.b
    _, c, hh, ww = ctx.shape(0)
    _, _, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw), pads = a["strides"], a["dilations"], a["pads"]
    per, bits = dot.per_unit, 32 // dot.per_unit
    units = row_units(ctx.key, per)
    cols_pad = taps_geometry(ctx.key, dot).cols_pad
    cols = b.bitcast(ctx.scratch, h.I32.as_pointer())
    x_img = gep(b, ctx.ins[0], b.mul(n, h.i64(c * hh * ww)))
    fill_byte = ir.Constant(h.I8, fill)

    def word(row_at: ir.Value, ox: ir.Value, pairs, checked: bool) -> ir.Value:
        """The unit of (tap column, channel) ``pairs`` at output column ``ox``; zero points past them."""
        out = h.const(h.I32, 0)
        for j in range(per):
            if j < len(pairs):
                tx, ch = pairs[j]
                ix = b.add(b.mul(ox, h.i64(sw)), h.i64(tx * dw - pads[1]))
                ok = b.icmp_unsigned("<", ix, h.i64(ww)) if checked else None
                at = b.add(row_at, b.select(ok, ix, h.i64(0)) if checked else ix)
                v = h.load(b, x_img, b.add(at, h.i64(ch * hh * ww)))
                v = b.xor(v, ir.Constant(h.I8, 0x80)) if flip else v
                v = b.select(ok, v, fill_byte) if checked else v
            else:
                v = fill_byte
            out = b.or_(out, b.shl(b.zext(v, h.I32), h.const(h.I32, bits * j)))
        return out

    for ty in range(kh):
        for u in range(units):
            pairs = [divmod(e, c) for e in range(u * per, min((u + 1) * per, kw * c))]
            spans = [valid_span(ow, sw, tx * dw - pads[1], ww) for tx, _ in pairs]
            lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
            hi = max(lo, hi)
            dst0 = (ty * units + u) * cols_pad
            with h.for_range(b, oh, name="qtaps.oy") as oy:
                iy = b.add(b.mul(oy, h.i64(sh)), h.i64(ty * dh - pads[0]))
                out_row = b.add(h.i64(dst0), b.mul(oy, h.i64(ow)))
                with b.if_else(b.icmp_unsigned("<", iy, h.i64(hh))) as (inside, outside):
                    with inside:
                        row_at = b.mul(iy, h.i64(ww))
                        for start, stop, checked in ((0, lo, True), (lo, hi, False), (hi, ow, True)):
                            if stop > start:
                                with h.for_range(b, stop, start=start, name="qtaps.ox") as ox:
                                    h.store(b, word(row_at, ox, pairs, checked), cols, b.add(out_row, ox))
                    with outside:
                        with h.for_range(b, ow, name="qtaps.zp") as ox:
                            h.store(b, word_fill, cols, b.add(out_row, ox))
    return b.bitcast(cols, h.I8P)
