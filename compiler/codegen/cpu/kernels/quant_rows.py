"""QConv with small output planes as the transposed GEMM: output channels in vector lanes, pixels
broadcast, and no product with the padding.

Pixels as vector lanes (``quant.py``'s im2col GEMM) waste lanes when the plane is small, and an
im2col multiplies its zero-point padding like any other value: a 3x3 conv with pad 1 on a 4x4
output (ResNet-18's 512-channel layers) spends 44 of its 144 products per channel on the border,
on 8x8 outputs 16%. Here each output pixel is a broadcast row and VL output channels a vector; which
(pixel, tap) pairs read inside the image is known when compiling, so a tile of pixels runs one loop
over the input's channel quads per tap, with only the pixels that tap sees. The activations stay in
their channel-quad plane (no im2col); the zero point comes out through per-pixel weight sums over
that pixel's valid taps, packed with the weights.

Packed weights: ``[pixel][M_pad]`` int32 compensations (``-zp * sum of w over the pixel's valid
taps``), then int8 ``[M_pad / VL][tap][channel unit][VL][per unit]``: each block of VL output
channels is one contiguous stream. The bias is int32, padded to whole vectors. On AVX2's int16
pairs (``avx2-wd``) a unit is two channels: the weights stay int8 in memory (half the bytes that
int16 would stream; ResNet-18's 512-channel layers do not fit in L2) and are widened by
``vpmovsxbw`` as they are loaded, one widening per vector that feeds every pixel of the tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ....ops.quant import clamp_bounds
from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ..int_dot import Dot, choose_dot
from ...irhelpers import gep
from .base import KernelContext, KernelKey
from .quant_units import multipliers

ROWS = "qrows:"  # + the Dot kind the packing was made for
BIAS = "qrows-bias"
BIAS_PAD = 16  # the widest VL: a bias padded to this many lanes serves every target
ALIGN = 64
I16 = ir.IntType(16)
WIDENED = "rows.w16"  # the name of int8 weights widened to int16 pairs in the IR


@dataclass(frozen=True)
class RowsPlan:
    """Which input pixel (row-major offset) each (output pixel, tap) reads, or None in the padding."""

    m: int
    cu: int  # channel units: quads, or int16 pairs (``Dot.per_unit``)
    per_unit: int
    taps: int
    plane_in: int
    reads: tuple[tuple[int | None, ...], ...]  # [pixel][tap]

    @property
    def pixels(self) -> int:
        return len(self.reads)


def rows_plan(key: KernelKey, per_unit: int) -> RowsPlan:
    a = dict(key.attrs)
    _, c, hh, ww = key.in_types[0].shape
    m, _, kh, kw = key.in_types[1].shape
    oh, ow = key.out_types[0].shape[2:]
    (sh, sw), (dh, dw), pads = a["strides"], a["dilations"], a["pads"]
    reads = []
    for oy in range(oh):
        for ox in range(ow):
            row = []
            for ty in range(kh):
                for tx in range(kw):
                    iy, ix = oy * sh + ty * dh - pads[0], ox * sw + tx * dw - pads[1]
                    row.append(iy * ww + ix if 0 <= iy < hh and 0 <= ix < ww else None)
            reads.append(tuple(row))
    return RowsPlan(m, -(-c // per_unit), per_unit, kh * kw, hh * ww, tuple(reads))


def rows_ok(key: KernelKey, target: Target) -> bool:
    """One group, constant weights (and bias), an output plane of at most the tuned pixel count; a 1x1
    conv (no padding to skip) only where its pixels would leave most of the im2col GEMM's pixel vectors
    empty (``Tuning.int8_rows_1x1_max_fill``)."""
    a = dict(key.attrs)
    if a["group"] != 1 or len(key.in_types[0].shape) != 4 or key.packed[1] != "const" or target.scalable:
        return False
    if len(key.in_types) == 3 and key.packed[2] != "const":
        return False
    pixels = math.prod(key.out_types[0].shape[2:])
    dot = choose_dot(target, False)
    if dot.kind == "amx":
        return False  # its tiles (never timed against this)
    if math.prod(key.in_types[1].shape[2:]) < 2:
        if pixels > target.tuning.int8_rows_1x1_max_fill * -(-pixels // dot.vl) * dot.vl:  # a pixel a lane
            return False
    return 0 < pixels <= target.tuning.int8_rows_max_pixels and key.in_types[1].shape[0] > 0


def pack_rows(key: KernelKey, i: int, arr: np.ndarray, dot: Dot, zp_enc: int) -> tuple[str, np.ndarray] | None:
    """Weights as module docstring says (``arr`` [M, C, KH, KW] int8); the bias padded."""
    if i == 2:
        out = np.zeros(-(-arr.size // BIAS_PAD) * BIAS_PAD, np.int32)
        out[: arr.size] = arr
        return BIAS, out
    plan = rows_plan(key, dot.per_unit)
    m, c = arr.shape[:2]
    vl, per = dot.vl, dot.per_unit
    m_pad = -(-m // vl) * vl
    taps = np.zeros((m_pad, plan.taps, per * plan.cu), np.int8)  # [m][tap][channel]
    taps[:m, :, :c] = arr.reshape(m, c, plan.taps).transpose(0, 2, 1)
    tap_sums = taps.astype(np.int64).sum(axis=2)  # [m][tap]
    valid = np.array([[r is not None for r in px] for px in plan.reads], np.int64)  # [pixel][tap]
    comp = (-zp_enc * (valid @ tap_sums.T)).astype(np.int64)  # [pixel][m_pad]
    comp = ((comp + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)  # int32 wrap, as the kernel adds
    blocks = taps.reshape(m_pad // vl, vl, plan.taps, plan.cu, per).transpose(0, 2, 3, 1, 4)
    head = np.zeros(_comp_bytes(plan, m_pad) // 4, np.int32)
    head[: comp.size] = comp.reshape(-1)
    return ROWS + dot.kind, np.concatenate([head.view(np.uint8), np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)])


def _comp_bytes(plan: RowsPlan, m_pad: int) -> int:
    return -(-4 * plan.pixels * m_pad // ALIGN) * ALIGN


def rows_quads_bytes(plan: RowsPlan) -> int:
    return -(-4 * plan.cu * plan.plane_in // ALIGN) * ALIGN


def rows_scratch(key: KernelKey, dot: Dot) -> int:
    """The input's channel-unit plane, then the requantized outputs by pixel ``[pixel][M_pad]``."""
    plan = rows_plan(key, dot.per_unit)
    return rows_quads_bytes(plan) + plan.pixels * -(-plan.m // dot.vl) * dot.vl + ALIGN


def channel_vectors(dot: Dot, target: Target) -> int:
    """Channel vectors per tile: two on AVX2's 16 registers, so that each pixel broadcast feeds two
    ``vpmaddwd`` (ResNet-18's stride-2 layer4 conv at x86-avx2 on Zen 4: 849 -> 695 k cycles against
    one vector of 11 pixels); one elsewhere (32 registers, or never timed)."""
    return 2 if dot.kind.startswith("avx2") and target.tuning.vector_registers <= 16 else 1


def tile(dot: Dot, target: Target, pixels: int, nr: int = 1) -> int:
    """Pixels per tile, ``nr`` channel vectors each: as many accumulators as the registers hold
    (besides the weight vectors, a broadcast and ``vpmaddubsw``'s ones), so that each weight vector
    loaded feeds the most pixels (on Zen 4 ResNet-18's 8x8 and 4x4 layers ran 1.15x / 1.3x faster
    than in tiles of 6 pixels x 4 vectors), tiles balanced."""
    spare = (target.tuning.vector_registers - 2 - nr - (dot.kind == "avx2-ubsw")) // nr
    mr = max(1, min(pixels, spare))
    tiles = -(-pixels // mr)
    return -(-pixels // tiles)


def pixel_tiles(plan: RowsPlan, mr: int) -> list[tuple[int, ...]]:
    """Pixels in tiles of at most ``mr``, those that see the same taps together (the interior, each
    border run), so that a tap's loop feeds every pixel of its tile as often as it can."""
    order = sorted(range(plan.pixels), key=lambda p: (tuple(r is None for r in plan.reads[p]), p))
    count = -(-plan.pixels // mr)
    size = -(-plan.pixels // count)
    return [tuple(order[i:i + size]) for i in range(0, plan.pixels, size)]


def emit_rows_qconv(ctx: KernelContext, dot: Dot, quads: ir.Value, n: ir.Value) -> None:
    """Image ``n`` of the conv from its channel-unit plane ``quads`` (``i32*``, ``[cu][plane]``)."""
    a, b = ctx.attrs, ctx.b
    plan = rows_plan(ctx.key, dot.per_unit)
    vl, m = dot.vl, plan.m
    m_pad = -(-m // vl) * vl
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mtab, m_one = multipliers(ctx, pad=m_pad)
    ft = ir.VectorType(h.F32, vl)
    comp = b.bitcast(ctx.ins[1], h.I32.as_pointer())
    weights = gep(b, ctx.ins[1], _comp_bytes(plan, m_pad))
    bias = b.bitcast(ctx.ins[2], h.I32.as_pointer()) if len(ctx.in_types) == 3 else None
    out_img = gep(b, ctx.outs[0], b.mul(n, h.i64(m * plan.pixels)))
    unit_bytes = vl * plan.per_unit  # one weight vector: int8, widened to int16 pairs for avx2-wd
    block_bytes = plan.taps * plan.cu * unit_bytes
    stored = ir.VectorType(h.I8, unit_bytes)

    nvec = m_pad // vl
    nr_main = min(channel_vectors(dot, ctx.target), nvec)
    tilings = {nr: pixel_tiles(plan, tile(dot, ctx.target, plan.pixels, nr)) for nr in {nr_main, 1}}
    orders = {nr: qm.table(b, f"{ctx.name}.px{nr}", [px for t in ts for px in t], h.I64) for nr, ts in tilings.items()}
    staged = b.bitcast(h.entry_alloca(b, ir.ArrayType(dot.lanes_type, plan.pixels * nr_main), "staged"),
                       dot.lanes_type.as_pointer())
    by_pixel = gep(b, b.bitcast(quads, h.I8P), rows_quads_bytes(plan))  # [pixel][m_pad] requantized bytes

    def lanes(ptr: ir.Value, index: ir.Value, t: ir.VectorType) -> ir.Value:
        return b.load(b.bitcast(gep(b, ptr, index), t.as_pointer()), align=4)

    def weight_vector(index: ir.Value) -> ir.Value:
        v = lanes(weights, index, stored)
        wide = ir.VectorType(I16, unit_bytes)
        return v if plan.per_unit == 4 else b.bitcast(b.sext(v, wide, name=WIDENED), dot.bytes_type)

    def epilogue(order, first: int, count: int, ch: ir.Value, j: int) -> None:
        """The tile's staged sums (pixels ``order[first:first + count]``), requantized, by pixel."""
        with h.for_range(b, count, name="e") as i:
            px = h.load(b, order, b.add(i, h.i64(first)))
            acc = b.add(h.load(b, staged, b.add(i, h.i64(j * count))), lanes(comp, b.add(ch, b.mul(px, h.i64(m_pad))), dot.lanes_type))
            if bias is not None:
                acc = b.add(acc, lanes(bias, ch, dot.lanes_type))
            mult = lanes(mtab, ch, ft) if mtab is not None else h.const(ft, m_one)
            q = qm.requantize(b, acc, mult, a["y_zero_point"], lo, hi)
            b.store(q, b.bitcast(gep(b, by_pixel, b.add(ch, b.mul(px, h.i64(m_pad)))), q.type.as_pointer()), align=1)

    def run_tile(ch0: ir.Value, first: int, pixels: tuple[int, ...], nr: int) -> None:
        """Channels ``ch0 .. ch0 + nr VL`` of ``pixels``, a tap's loop for the pixels it sees."""
        slots = {}
        for px in pixels:
            for j in range(nr):
                slots[px, j] = h.entry_alloca(b, dot.lanes_type, "acc")
                b.store(ir.Constant(dot.lanes_type, None), slots[px, j])
        wbase = b.mul(b.udiv(ch0, h.i64(vl)), h.i64(block_bytes))
        for t in range(plan.taps):
            seen = [(px, plan.reads[px][t]) for px in pixels if plan.reads[px][t] is not None]
            if not seen:
                continue
            with h.for_range(b, plan.cu, name="q") as q:
                at = b.add(wbase, b.mul(b.add(h.i64(t * plan.cu), q), h.i64(unit_bytes)))
                wvs = [weight_vector(b.add(at, h.i64(j * block_bytes))) for j in range(nr)]
                qrow = b.mul(q, h.i64(plan.plane_in))
                for px, off in seen:
                    x = b.bitcast(qm.splat_value(b, h.load(b, quads, b.add(qrow, h.i64(off))), dot.lanes_type),
                                  dot.bytes_type)
                    for j, wv in enumerate(wvs):
                        b.store(dot.step(b, b.load(slots[px, j]), x, wv), slots[px, j])
        for j in range(nr):
            for i, px in enumerate(pixels):
                h.store(b, b.load(slots[px, j]), staged, i + j * len(pixels))
            epilogue(orders[nr], first, len(pixels), b.add(ch0, h.i64(j * vl)), j)

    def channel_block(ch0: ir.Value, nr: int) -> None:
        first = 0
        for pixels in tilings[nr]:
            run_tile(ch0, first, pixels, nr)
            first += len(pixels)

    main = nvec // nr_main * nr_main * vl
    with h.for_range(b, main, step=nr_main * vl, name="cv") as ch0:
        channel_block(ch0, nr_main)
    if main < m_pad:
        channel_block(h.i64(main), 1)
    with h.loop_nest(b, (m, plan.pixels), name="t") as (c, px):  # [pixel][channel] -> NCHW
        h.store(b, h.load(b, by_pixel, b.add(c, b.mul(px, h.i64(m_pad)))), out_img,
                b.add(b.mul(c, h.i64(plan.pixels)), px))
