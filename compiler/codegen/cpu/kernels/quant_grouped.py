"""QConv without the GEMM: grouped and depthwise convs, and weights given at run time.

Each input channel is first copied into a zero-bordered int16 plane of centred values ``x - zp``, so
the tap loops need no bounds checks and the loop over output columns is a plain vector stream: at
column stride s the plane's columns are stored as s phases (column j at phase j % s, place j // s),
so each tap reads consecutive places for consecutive output columns at any stride. A depthwise conv (one input channel per output) sums every tap of an
output pixel in registers and requantizes it there; with more input channels per group, the int32
planes of a block of the group's outputs accumulate channel by channel, tap by tap, each input
channel's plane filled once per block (was: once per output channel). The pass pipeline splits a grouped
conv with constant weights and two or more channels a group into a conv a group (GEMMs:
``passes/split_groups.py``), so this kernel takes depthwise convs and weights given at run time.
"""

from __future__ import annotations

from llvmlite import ir

from ....ops.quant import clamp_bounds
from ... import irhelpers as h
from ... import quant_math as qm
from ...irhelpers import gep
from ..int_gemm import store_lanes
from .base import KernelContext, KernelKey
from .quant_pairs import PAIR_LANES, pair_madd, requantized, tap_pairs
from .quant_units import multiplier_at, multipliers

I16 = ir.IntType(16)
MAX_UNROLLED_TAPS = 64  # a depthwise window up to 8x8 is summed by straight-line code
ACC_BYTES = 1 << 17  # int32 output planes a grouped conv accumulates at once (each input plane filled once for them)


def padded_dims(key: KernelKey) -> tuple[int, int, int, int]:
    """(rows, cols, top pad, left pad) of the bordered plane: every tap of every output inside."""
    a = dict(key.attrs)
    _, _, hh, ww = key.in_types[0].shape
    _, _, kh, kw = key.in_types[1].shape
    oh, ow = key.out_types[0].shape[2:]
    (sh, sw), (dh, dw), pads = a["strides"], a["dilations"], a["pads"]
    rows = max(hh + pads[0], (oh - 1) * sh + (kh - 1) * dh + 1)
    cols = max(ww + pads[1], (ow - 1) * sw + (kw - 1) * dw + 1)
    return rows, cols, pads[0], pads[1]


def _phase_width(key: KernelKey) -> tuple[int, int]:
    """(column stride = phases, places per phase row)."""
    sw = dict(key.attrs)["strides"][1]
    return sw, -(-padded_dims(key)[1] // sw)


def _plane_bytes(key: KernelKey) -> int:
    rows = padded_dims(key)[0]
    sw, pw = _phase_width(key)
    return -(-2 * rows * sw * pw // 64) * 64


def _tap_origin(key: KernelKey, ty: int | ir.Value, tx: int, b: ir.IRBuilder | None = None):
    """Plane index of tap (ty, tx) for output (0, 0); output (oy, ox) adds oy * sh * row + ox."""
    (dh, dw) = dict(key.attrs)["dilations"]
    sw, pw = _phase_width(key)
    col = (tx * dw) % sw * pw + (tx * dw) // sw
    if isinstance(ty, int):
        return ty * dh * sw * pw + col
    return b.add(b.mul(ty, h.i64(dh * sw * pw)), h.i64(col))


def _block(key: KernelKey) -> int:
    """Output channels of a group accumulated together: the most whose int32 planes fit
    ``ACC_BYTES`` (a divisor of the group's outputs), at least one."""
    oh, ow = key.out_types[0].shape[2:]
    mg = key.in_types[1].shape[0] // dict(key.attrs)["group"]
    fit = max(1, ACC_BYTES // max(1, 4 * oh * ow))
    return max(d for d in range(1, mg + 1) if mg % d == 0 and d <= fit) if mg else 1


def grouped_scratch(key: KernelKey) -> int:
    oh, ow = key.out_types[0].shape[2:]
    return _plane_bytes(key) + 4 * _block(key) * oh * ow + 64


def _fill_plane(ctx: KernelContext, n: ir.Value, channel: ir.Value, plane: ir.Value) -> None:
    """Input channel ``channel`` of image ``n``, centred, into the zero-bordered int16 plane."""
    b = ctx.b
    _, c, hh, ww = ctx.shape(0)
    rows, _, top, left = padded_dims(ctx.key)
    sw, pw = _phase_width(ctx.key)
    h.memset0(b, ctx.scratch, 2 * rows * sw * pw)
    xz = h.const(h.I32, ctx.attrs["x_zero_point"])
    src = b.mul(b.add(b.mul(n, h.i64(c)), channel), h.i64(hh * ww))
    with h.for_range(b, hh, name="cy") as iy:
        src_row = b.add(src, b.mul(iy, h.i64(ww)))
        dst_row = b.mul(b.add(iy, h.i64(top)), h.i64(sw * pw))
        for phase in range(sw):  # place j of this phase is input column j * sw + phase - left
            lo, hi = valid_span(pw, sw, phase - left, ww)
            if hi <= lo:
                continue
            with h.for_range(b, hi, start=lo, name="cx") as j:
                ix = b.add(b.mul(j, h.i64(sw)), h.i64(phase - left))
                v = qm.widen(b, h.load(b, ctx.ins[0], b.add(src_row, ix)), ctx.in_types[0].dtype)
                h.store(b, b.trunc(b.sub(v, xz), I16), plane, b.add(dst_row, b.add(j, h.i64(phase * pw))))


def valid_span(out: int, stride: int, offset: int, size: int) -> tuple[int, int]:
    """The outputs ``o`` in ``[lo, hi)`` whose input ``o * stride + offset`` lies in ``[0, size)``."""
    lo = min(out, max(0, -(offset // stride)))
    hi = max(lo, min(out, (size - 1 - offset) // stride + 1))
    return lo, hi


def emit_grouped_qconv(ctx: KernelContext) -> None:
    a, b = ctx.attrs, ctx.b
    n_img, _, _, _ = ctx.shape(0)
    m, cg, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    sh, g = a["strides"][0], a["group"]
    sw, pw = _phase_width(ctx.key)
    mg = m // g
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mults = multipliers(ctx)
    plane = b.bitcast(ctx.scratch, I16.as_pointer())
    acc = h.byte_ptr(b, ctx.scratch, _plane_bytes(ctx.key), h.I32)
    depthwise = cg == 1 and kh * kw <= MAX_UNROLLED_TAPS
    if not depthwise:
        _grouped_planes(ctx, plane, acc, mults, lo, hi)
        return
    with h.loop_nest(b, (n_img, m)) as (n, oc):
        init = h.load(b, ctx.ins[2], oc) if len(ctx.in_types) == 3 else h.const(h.I32, 0)
        mult = multiplier_at(b, mults, oc)
        base = b.mul(b.add(b.mul(n, h.i64(m)), oc), h.i64(oh * ow))
        ch0 = b.mul(b.udiv(oc, h.i64(mg)), h.i64(cg))
        _fill_plane(ctx, n, ch0, plane)
        wbase = b.mul(oc, h.i64(kh * kw))
        taps = [(b.sext(h.load(b, ctx.ins[1], b.add(wbase, h.i64(ty * kw + tx))), h.I32),
                 _tap_origin(ctx.key, ty, tx)) for ty in range(kh) for tx in range(kw)]
        if tap_pairs(ctx.target):
            _depthwise_by_pairs(ctx, plane, taps, init, mult, base, lo, hi)
        else:
            with h.loop_nest(b, (oh, ow), name="t") as (oy, ox):
                at = h.linear(b, (oy, ox), (sh * sw * pw, 1))
                total = init
                for wv, origin in taps:
                    x = b.sext(h.load(b, plane, b.add(at, h.i64(origin))), h.I32)
                    total = b.add(total, b.mul(x, wv))
                q = qm.requantize(b, total, mult, a["y_zero_point"], lo, hi)
                h.store(b, q, ctx.outs[0], b.add(base, h.linear(b, (oy, ox), (ow, 1))))


def _depthwise_by_pairs(ctx: KernelContext, plane: ir.Value, taps: list, init: ir.Value, mult: ir.Value,
                        base: ir.Value, lo: int, hi: int) -> None:
    """One channel's output rows, 16 columns a step: each pair of taps is one ``vpmaddwd`` per 8 columns over
    the two taps' columns interleaved, against their two weights as one 32-bit word (an odd last tap pairs
    with itself and a zero weight). Exact: every product and pair sum fits int32, as the one-tap loop's.
    Loads may read up to 15 values past a row's last output; the scratch has room and those lanes are
    never stored."""
    b, a = ctx.b, ctx.attrs
    oh, ow = ctx.out_shape[2:]
    sh = a["strides"][0]
    sw, pw = _phase_width(ctx.key)
    x16, v8 = ir.VectorType(I16, PAIR_LANES), ir.VectorType(h.I32, PAIR_LANES // 2)
    pairs = []
    for k in range(0, len(taps), 2):
        (w0, o0), (w1, o1) = taps[k], taps[k + 1] if k + 1 < len(taps) else (h.const(h.I32, 0), taps[k][1])
        word = b.or_(b.and_(w0, h.const(h.I32, 0xFFFF)), b.shl(w1, h.const(h.I32, 16)))
        pairs.append((b.bitcast(qm.splat_value(b, word, v8), x16), o0, o1))
    ft = ir.VectorType(h.F32, PAIR_LANES // 2)
    init_v, mult_v = qm.splat_value(b, init, v8), qm.splat_value(b, mult, ft)

    def step(row_at: ir.Value, out_at: ir.Value, count: int) -> None:
        sums = [h.vector(v8, None), h.vector(v8, None)]
        for wv, o0, o1 in pairs:
            x0, x1 = (b.load(b.bitcast(gep(b, plane, b.add(row_at, h.i64(o))), x16.as_pointer()), align=2)
                      for o in (o0, o1))
            sums = pair_madd(b, sums, x0, x1, [wv, wv])
        q = requantized(b, sums, lambda _, s: qm.requantize(b, b.add(s, init_v), mult_v, a["y_zero_point"], lo, hi))
        store_lanes(b, q, gep(b, ctx.outs[0], out_at), None if count == PAIR_LANES else count,
                    ctx.target.tuning.masked_stores)

    full, rest = divmod(ow, PAIR_LANES)
    with h.for_range(b, oh, name="t") as oy:
        row_at, out_row = b.mul(oy, h.i64(sh * sw * pw)), b.add(base, b.mul(oy, h.i64(ow)))
        if full:
            with h.for_range(b, full, name="tx") as xb:
                ox = b.mul(xb, h.i64(PAIR_LANES))
                step(b.add(row_at, ox), b.add(out_row, ox), PAIR_LANES)
        if rest:
            step(b.add(row_at, h.i64(full * PAIR_LANES)), b.add(out_row, h.i64(full * PAIR_LANES)), rest)


def _grouped_planes(ctx: KernelContext, plane, acc, mults, lo: int, hi: int) -> None:
    """Per block of a group's outputs (``_block``): their int32 planes (biases), then each input
    channel's plane filled once and added, tap by tap, into every output of the block; then all
    requantized."""
    a, b = ctx.attrs, ctx.b
    n_img = ctx.shape(0)[0]
    m, cg, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    sh, g = a["strides"][0], a["group"]
    sw, pw = _phase_width(ctx.key)
    mg, px, jb = m // g, oh * ow, _block(ctx.key)
    with h.loop_nest(b, (n_img, g, mg // jb), name="grp") as (n, gi, blk):
        oc0 = b.add(b.mul(gi, h.i64(mg)), b.mul(blk, h.i64(jb)))
        with h.loop_nest(b, (jb, px), name="z") as (j, p):
            init = h.load(b, ctx.ins[2], b.add(oc0, j)) if len(ctx.in_types) == 3 else h.const(h.I32, 0)
            h.store(b, init, acc, b.add(b.mul(j, h.i64(px)), p))
        with h.for_range(b, cg, name="ic") as ic:
            _fill_plane(ctx, n, b.add(b.mul(gi, h.i64(cg)), ic), plane)
            with h.loop_nest(b, (jb, kh), name="jt") as (j, ty):
                wbase = b.mul(b.add(b.mul(b.add(oc0, j), h.i64(cg)), ic), h.i64(kh * kw))
                accj = b.mul(j, h.i64(px))
                for tx in range(kw):  # one vector loop for every tap
                    wv = b.sext(h.load(b, ctx.ins[1], b.add(wbase, b.add(b.mul(ty, h.i64(kw)), h.i64(tx)))), h.I32)
                    origin = _tap_origin(ctx.key, ty, tx, b)
                    with h.loop_nest(b, (oh, ow), name="t") as (oy, ox):
                        x = b.sext(h.load(b, plane, h.linear(b, (oy, ox), (sh * sw * pw, 1), base=origin)), h.I32)
                        out = b.add(accj, h.linear(b, (oy, ox), (ow, 1)))
                        h.store(b, b.add(h.load(b, acc, out), b.mul(x, wv)), acc, out)
        with h.loop_nest(b, (jb, px), name="rq") as (j, p):
            oc = b.add(oc0, j)
            mult = multiplier_at(b, mults, oc)
            q = qm.requantize(b, h.load(b, acc, b.add(b.mul(j, h.i64(px)), p)), mult, a["y_zero_point"], lo, hi)
            h.store(b, q, ctx.outs[0], b.add(b.mul(b.add(b.mul(n, h.i64(m)), oc), h.i64(px)), p))
