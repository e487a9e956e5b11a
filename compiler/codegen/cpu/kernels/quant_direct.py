"""QConv on VNNI reading its taps in place: no im2col, output columns in vector lanes.

The im2col GEMM of ``quant.py`` copies the activations once per tap (a 64-channel 32x32 3x3 conv
writes and then streams 576 KiB); on ``vpdpbusd`` targets that copy, not the multiplies, is what
its large-plane convs lose to. Here the input is packed once per run into zero-point-padded planes
of channel quads (4 input channels a 32-bit word, ``vpdpbusd``'s unit), split by stride phase so
that every tap of every output row reads VL consecutive words: the vector for output pixels
``(oy, ox .. ox + VL)`` at tap ``(ty, tx)`` is the plane of phase ``(ty*dh % sh, tx*dw % sw)`` at row
``oy + ty*dh // sh``, column ``ox + tx*dw // sw``. A register tile is MR output channels (their
weight quads broadcast, packed at compile time in the im2col GEMM's broadcast rows) by NR vectors
of output pixels (whole output rows, or pieces of a wide one). The padding is zero points, taken
out with the weight row sums as in the GEMM, so the arithmetic is the GEMM's, exactly. Kernel rows
that read only padding rows (the first and last output rows) are not multiplied: those tiles start
from the zero point times those kernel rows' weight sums (packed after the broadcast rows), which
is what the products would have added (4% of a 16x16 3x3 conv's products, 2% at 32x32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ..int_dot import Dot, choose_dot
from ...irhelpers import gep
from .base import KernelContext, KernelKey

DIRECT = "qdirect:"  # + the Dot kind the packing was made for
ACC_NAME = "direct.acc"  # the name of the tiles' accumulators in the IR
ALIGN = 64


@dataclass(frozen=True)
class DirectPlan:
    """The phase planes' geometry and the output's vector rows."""

    c: int
    hh: int
    ww: int
    oh: int
    ow: int
    kh: int
    kw: int
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]  # top, left
    vl: int
    ph: int  # rows of a phase plane
    pw: int  # words in a phase-plane row

    @property
    def cu(self) -> int:
        return -(-self.c // 4)

    @property
    def vectors_per_row(self) -> int:
        return -(-self.ow // self.vl)

    @property
    def phase_words(self) -> int:
        return self.ph * self.pw

    @property
    def quad_words(self) -> int:
        """Words of one channel quad: all its phase planes."""
        return self.strides[0] * self.strides[1] * self.phase_words

    @property
    def plane_bytes(self) -> int:
        return -(-4 * self.cu * self.quad_words // ALIGN) * ALIGN

    def tap_offset(self, ty: int, tx: int) -> int:
        """Where tap (ty, tx) of output pixel (0, 0) reads, in words from its quad's first plane."""
        (sh, sw), (dh, dw) = self.strides, self.dilations
        phase = (ty * dh % sh) * sw + tx * dw % sw
        return phase * self.phase_words + (ty * dh // sh) * self.pw + tx * dw // sw


def direct_plan(key: KernelKey, dot: Dot) -> DirectPlan:
    a = dict(key.attrs)
    _, c, hh, ww = key.in_types[0].shape
    _, _, kh, kw = key.in_types[1].shape
    oh, ow = key.out_types[0].shape[2:]
    (sh, sw), (dh, dw), pads = tuple(a["strides"]), tuple(a["dilations"]), a["pads"]
    hp, wp = hh + pads[0] + pads[2], ww + pads[1] + pads[3]
    vpr = -(-ow // dot.vl)
    pw = max(-(-wp // sw), vpr * dot.vl + (kw - 1) * dw // sw)  # a partial vector's reads stay in its row
    return DirectPlan(c, hh, ww, oh, ow, kh, kw, (sh, sw), (dh, dw), (pads[0], pads[1]), dot.vl,
                      -(-hp // sh), pw)


def direct_ok(key: KernelKey, target: Target) -> bool:
    """One group, 2-D, a kernel larger than 1x1, constant weights, at least a quad of input channels
    (fewer: ``quant_taps.py``), on ``vpdpbusd`` (not AMX), output rows of ``int8_direct_min_width``
    or more that fill ``int8_direct_min_lane_use`` of their vectors (a row's last vector is partly
    idle; the im2col GEMM's pixel vectors run on across rows)."""
    a = dict(key.attrs)
    if a["group"] != 1 or len(key.in_types[0].shape) != 4 or key.packed[1] is None:
        return False
    tuning, dot = target.tuning, choose_dot(target, False)
    m, c, kh, kw = key.in_types[1].shape
    if not tuning.int8_direct_min_width or kh * kw < 2 or c < 4 or m == 0 or dot.kind != "vnni":
        return False
    oh, ow = key.out_types[0].shape[2:]
    lane_use = ow / (-(-ow // dot.vl) * dot.vl)
    return ow >= tuning.int8_direct_min_width and oh > 0 and lane_use >= tuning.int8_direct_min_lane_use


def direct_scratch(key: KernelKey, dot: Dot) -> int:
    return direct_plan(key, dot).plane_bytes + ALIGN


def _interleave(b: ir.IRBuilder, rows: list[ir.Value], vl: int) -> ir.Value:
    """Four ``<VL x i8>`` channel rows as ``<4VL x i8>`` channel quads (byte 4j + k: row k's j)."""
    t2 = list(range(2 * vl))
    lo = b.shuffle_vector(rows[0], rows[1], h.vector(ir.VectorType(h.I32, 2 * vl), t2))
    hi = b.shuffle_vector(rows[2], rows[3], h.vector(ir.VectorType(h.I32, 2 * vl), t2))
    order = [k * vl + j for j in range(vl) for k in range(4)]
    return b.shuffle_vector(lo, hi, h.vector(ir.VectorType(h.I32, 4 * vl), order))


def _pack_planes(ctx: KernelContext, plan: DirectPlan, n: ir.Value, flip: bool, fill: int) -> ir.Value:
    """Image ``n`` as zero-point-padded phase planes of channel quads in scratch; an ``i32*``."""
    b = ctx.b
    vl, (sh, sw), (pt, pl) = plan.vl, plan.strides, plan.pads
    h.memset(b, ctx.scratch, fill, plan.plane_bytes)
    words = b.bitcast(ctx.scratch, h.I32.as_pointer())
    plane_px = plan.hh * plan.ww
    x_img = gep(b, ctx.ins[0], b.mul(n, h.i64(plan.c * plane_px)))
    byte_row = ir.VectorType(h.I8, vl)
    fill_row = h.const(byte_row, fill)
    flip_row = h.const(byte_row, 0x80) if flip else None

    def word_at(q: ir.Value, iy: ir.Value, ix: ir.Value) -> ir.Value:
        """Where input pixel (iy, ix) of quad q goes, in words."""
        ry, rx = b.add(iy, h.i64(pt)), b.add(ix, h.i64(pl))
        phase = b.add(b.mul(b.urem(ry, h.i64(sh)), h.i64(sw)), b.urem(rx, h.i64(sw)))
        at = b.add(b.mul(b.udiv(ry, h.i64(sh)), h.i64(plan.pw)), b.udiv(rx, h.i64(sw)))
        return b.add(b.add(b.mul(q, h.i64(plan.quad_words)), b.mul(phase, h.i64(plan.phase_words))), at)

    def quad(q: ir.Value, channels: int) -> None:
        first = b.mul(q, h.i64(4 * plane_px))
        with h.for_range(b, plan.hh, name="dy") as iy:
            src = b.add(first, b.mul(iy, h.i64(plan.ww)))
            full = plan.ww // vl * vl
            if full:
                with h.for_range(b, full, step=vl, name="dx") as ix0:
                    rows = []
                    for k in range(4):
                        if k < channels:
                            ptr = gep(b, x_img, b.add(src, b.add(ix0, h.i64(k * plane_px))))
                            v = b.load(b.bitcast(ptr, byte_row.as_pointer()), align=1)
                            rows.append(b.xor(v, flip_row) if flip else v)
                        else:
                            rows.append(fill_row)
                    packed = b.bitcast(_interleave(b, rows, vl), ir.VectorType(h.I32, vl))
                    if sw == 1:
                        dst = gep(b, words, word_at(q, iy, ix0))
                        b.store(packed, b.bitcast(dst, packed.type.as_pointer()), align=4)
                    else:
                        for j in range(vl):
                            h.store(b, b.extract_element(packed, ir.Constant(h.I32, j)), words,
                                    word_at(q, iy, b.add(ix0, h.i64(j))))
            if full < plan.ww:
                with h.for_range(b, plan.ww, start=full, name="dr") as ix:
                    word = h.const(h.I32, 0)
                    for k in range(4):
                        if k < channels:
                            v = h.load(b, x_img, b.add(src, b.add(ix, h.i64(k * plane_px))))
                            v = b.xor(v, ir.Constant(h.I8, 0x80)) if flip else v
                        else:
                            v = ir.Constant(h.I8, fill)
                        word = b.or_(word, b.shl(b.zext(v, h.I32), h.const(h.I32, 8 * k)))
                    h.store(b, word, words, word_at(q, iy, ix))

    with h.for_range(b, plan.c // 4, name="dq") as q:
        quad(q, 4)
    if plan.c % 4:
        quad(h.i64(plan.c // 4), plan.c % 4)
    return words


def _row_pieces(vpr: int, nr: int) -> list[tuple[int, ...]]:
    """A row's vectors in balanced pieces of at most ``nr``."""
    count = -(-vpr // nr)
    size = -(-vpr // count)
    return [tuple(range(v, min(vpr, v + size))) for v in range(0, vpr, size)]


Epilogue = Callable[[ir.IRBuilder, ir.Value, ir.Value, ir.Value, "int | bool"], None]
"""(builder, output channel (i64), first output pixel (i64), <VL x i32> sums, valid lanes or False: all)."""


def kernel_row_sums(arr: np.ndarray) -> np.ndarray:
    """``[M, KH]`` int32: each output channel's weights summed over one kernel row (every channel and
    tap column), what a kernel row's products with the zero-point padding add up to, per unit of it."""
    return arr.astype(np.int64).sum(axis=(1, 3)).astype(np.int32)


def padded_rows(plan: DirectPlan, oy: int) -> tuple[int, ...]:
    """The kernel rows of output row ``oy`` that read only the zero-point padding above or below."""
    (sh, _), (dh, _), pt = plan.strides, plan.dilations, plan.pads[0]
    return tuple(ty for ty in range(plan.kh) if not 0 <= oy * sh + ty * dh - pt < plan.hh)


def even_rows(m: int, most: int) -> int:
    """Channels per register tile: the largest of ``most`` down to just over half of it that divides
    ``m``, else ``most``. A tile count that divides saves emitting a second, shorter tile for the rest
    of the channels in every row group: ResNet-18's int8 build for the Zen 4 fell from 113k LLVM
    instructions and 4.8 s to 2.9 s (4 channels a tile where 6 fit, at the same speed: 2.29 against
    2.30 ms)."""
    return next((d for d in range(most, most // 2, -1) if m % d == 0), most)


def emit_direct_qconv(ctx: KernelContext, dot: Dot, n: ir.Value, flip: bool, zp_enc: int, weights: ir.Value,
                      row_sums: ir.Value, epilogue: Epilogue) -> None:
    """Image ``n``: pack its planes, then every (pixel tile, channel block) register tile.
    ``weights``: the broadcast rows (``i8*``, row r's unit (tap, quad) at ``(r * taps * cu + tap * cu + q) * 4``);
    ``row_sums``: :func:`kernel_row_sums` (``i32*``). A tile of output rows whose taps read padding
    rows (the first and last tiles) is emitted apart, without those products: its accumulators start
    at what they would have added, ``zp_enc`` times the kernel rows' sums, so the epilogue's zero-point
    term stays the whole kernel's."""
    b = ctx.b
    plan = direct_plan(ctx.key, dot)
    words = _pack_planes(ctx, plan, n, flip, zp_enc & 0xFF)
    m = ctx.out_shape[1]
    vl, vpr, cu = plan.vl, plan.vectors_per_row, plan.cu
    k4 = plan.kh * plan.kw * cu
    nr_target = 4 if ctx.target.tuning.vector_registers >= 32 else 2
    rows_per_tile = max(1, nr_target // vpr)
    pieces = [tuple(range(vpr))] if vpr <= nr_target else _row_pieces(vpr, nr_target)
    tail = plan.ow - (vpr - 1) * vl  # valid lanes of a row's last vector

    def tile(oy0: ir.Value, skips: list[tuple[int, ...]], piece: tuple[int, ...], r0: ir.Value, mr: int) -> None:
        """Rows ``oy0 ..`` (``skips``: each one's padding kernel rows), vectors ``piece`` of each, ``mr`` channels."""
        vecs = [(r, v) for r in range(len(skips)) for v in piece]
        slots = []
        for i in range(mr):
            sums = [h.load(b, row_sums, b.add(b.mul(b.add(r0, h.i64(i)), h.i64(plan.kh)), h.i64(ty)))
                    for ty in range(plan.kh)] if any(skips) else []
            for r, _ in vecs:
                s = h.entry_alloca(b, dot.lanes_type, ACC_NAME)
                init = ir.Constant(dot.lanes_type, None)
                if skips[r]:
                    total = sums[skips[r][0]]
                    for ty in skips[r][1:]:
                        total = b.add(total, sums[ty])
                    init = qm.splat_value(b, b.mul(total, h.const(h.I32, zp_enc)), dot.lanes_type)
                b.store(init, s)
                slots.append(s)
        bases = [b.add(b.mul(b.add(oy0, h.i64(r)), h.i64(plan.pw)), h.i64(v * vl)) for r, v in vecs]
        wrow = b.mul(r0, h.i64(k4 * 4))
        for t in range(plan.kh * plan.kw):
            ty, tx = divmod(t, plan.kw)
            seen = [j for j, (r, _) in enumerate(vecs) if ty not in skips[r]]
            if not seen:
                continue
            with h.for_range(b, cu, name="dk") as q:
                qbase = b.add(b.mul(q, h.i64(plan.quad_words)), h.i64(plan.tap_offset(ty, tx)))
                xs = {j: b.load(b.bitcast(gep(b, words, b.add(qbase, bases[j])), dot.bytes_type.as_pointer()), align=4)
                      for j in seen}
                unit = b.add(wrow, b.mul(b.add(q, h.i64(t * cu)), h.i64(4)))
                for i in range(mr):
                    wq = b.load(b.bitcast(gep(b, weights, b.add(unit, h.i64(i * k4 * 4))), h.I32.as_pointer()), align=4)
                    w = b.bitcast(qm.splat_value(b, wq, dot.lanes_type), dot.bytes_type)
                    for j, x in xs.items():
                        s = slots[i * len(vecs) + j]
                        b.store(dot.step(b, b.load(s), x, w), s)
        for i in range(mr):
            row = b.add(r0, h.i64(i))
            for j, (r, v) in enumerate(vecs):
                col = b.add(b.mul(b.add(oy0, h.i64(r)), h.i64(plan.ow)), h.i64(v * vl))
                epilogue(b, row, col, b.load(slots[i * len(vecs) + j]), tail if v == vpr - 1 and tail < vl else False)

    def channel_blocks(oy0: ir.Value, skips: list[tuple[int, ...]]) -> None:
        for piece in pieces:
            nvec = len(skips) * len(piece)
            mr = even_rows(m, max(1, min(8, (ctx.target.tuning.vector_registers - nvec - 2) // nvec)))
            full = m // mr * mr
            if full:
                with h.for_range(b, full, step=mr, name="dm") as r0:
                    tile(oy0, skips, piece, r0, mr)
            if full < m:
                tile(oy0, skips, piece, h.i64(full), m - full)

    starts = list(range(0, plan.oh, rows_per_tile))
    skips = {s: [padded_rows(plan, oy) for oy in range(s, min(plan.oh, s + rows_per_tile))] for s in starts}
    plain = [s for s in starts if len(skips[s]) == rows_per_tile and not any(skips[s])]  # contiguous: padding
    # rows are a prefix and a suffix of the output rows
    first, last = (plain[0], plain[-1]) if plain else (plan.oh, plan.oh)
    for s in starts:
        if s < first or s > last:
            channel_blocks(h.i64(s), skips[s])
        elif s == first:
            with h.for_range(b, last + rows_per_tile, start=first, step=rows_per_tile, name="dy0") as oy0:
                channel_blocks(oy0, [()] * rows_per_tile)
