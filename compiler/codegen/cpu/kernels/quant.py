"""QConv with integer dot products (QMatMul is in ``quant_matmul.py``; QuantizeLinear, DequantizeLinear
and QAdd, element by element, in ``quant_elementwise.py``).

QConv (one group) with constant weights runs the integer GEMM of ``codegen/int_gemm.py`` with the
instruction set's dot product (``codegen/int_dot.py``): weights packed once into its 4-byte units
(byte quads, or int16 pairs for ``avx2-wd``) plus their row sums, activations packed per run into
scratch (the im2col) in the units and byte encoding the dot product wants. The zero point is taken
out afterwards, exactly: ``sum((x - zp) * w) = sum(x_enc * w) - zp_enc * sum(w)`` (``quant_units.py``).
On ``vpdpbusd`` a conv with wide output rows skips the im2col and reads its taps in place
(``quant_direct.py``), the same weight rows and epilogue. Grouped convs and weights computed at run
time go to ``quant_grouped.py``. Every path requantizes with ``codegen/quant_math.py``, bit for bit
the reference's float32 arithmetic; packed weights carry their multipliers (``quant_units.py``), so
the code of a packed QConv does not depend on its scales.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ....errors import CompileError
from ....target import Target
from ... import irhelpers as h
from ..int_dot import Dot, choose_dot, pairs_bounded
from ..int_gemm import GemmGeometry, emit_int_gemm, padded_cols
from ...irhelpers import SLOTTED, gep, set_fn_attrs
from .base import KernelContext, KernelKey, kernel
from .conv import BLOCKS
from .quant_direct import DIRECT, direct_ok, direct_scratch, emit_direct_qconv, kernel_row_sums
from .quant_dwrows import DWROWS, dwrows_ok, dwrows_scratch, emit_dwrows_qconv, pack_dwrows
from .quant_depthwise import LANES, emit_lanes_qconv, lanes_ok, lanes_scratch, pack_lanes
from .quant_grouped import emit_grouped_qconv, grouped_scratch, valid_span
from .quant_rows import ROWS, emit_rows_qconv, pack_rows, rows_ok, rows_scratch
from .quant_taps import TAPS, emit_taps_im2col, taps_geometry, taps_ok, taps_rows, taps_scratch
from .quant_units import (MULTIPLIERS, QUADS, SCALES, dot_of, encoding, multipliers, requant_epilogue, sums_bytes,
                          table_rows, with_multipliers)
from .quant_winograd import F2X2_LAYOUT, emit_winograd_qconv, pack_winograd, winograd_ok, winograd_scratch


def _conv_gemm_ok(key: KernelKey) -> bool:
    return dict(key.attrs)["group"] == 1 and key.packed[1] is not None and len(key.in_types[0].shape) == 4


def _conv_rows(arr: np.ndarray, per_unit: int) -> np.ndarray:
    """Weights as rows with K ordered (tap, channel), channels padded to units: the im2col's order."""
    m, c = arr.shape[:2]
    cu = -(-c // per_unit)
    k = math.prod(arr.shape[2:])
    taps = np.zeros((m, k, per_unit * cu), np.int16)
    taps[:, :, :c] = arr.reshape(m, c, k).transpose(0, 2, 1)  # sizes spelled out: C or M may be 0
    return taps.reshape(m, k * per_unit * cu)


def _pack_qconv(key: KernelKey, i: int, arr: np.ndarray, target: Target):
    """``_pack_layout``'s packing, the weights after their multipliers (``with_multipliers``)."""
    got = _pack_layout(key, i, arr, target)
    if got is None or i != 1:
        return got
    return got[0], with_multipliers(key, got[1])


def _carries_multipliers(key: KernelKey) -> bool:
    return key.packed[1] not in (None, "const")


def _qconv_code(key: KernelKey) -> KernelKey:
    """Packed weights carry the multipliers: the scales leave the code's key."""
    if not _carries_multipliers(key):
        return key
    return dataclasses.replace(key, attrs=tuple((k, v) for k, v in key.attrs if k not in SCALES))


def _pack_layout(key: KernelKey, i: int, arr: np.ndarray, target: Target):
    """The kernel is chosen here, by the layout its weights get: AVX2's Winograd first (from 16
    tiles: ResNet-18's 8x8 3x3 convs 1.12-1.15 M cycles transposed, 0.63-0.74 M by Winograd with its
    GEMM prefetching the weights, Zen 4), then small planes transposed."""
    if winograd_ok(key, target):
        return pack_winograd(key, i, arr, target)
    if rows_ok(key, target) and i in (1, 2):
        m = key.in_types[1].shape[0]
        dot = choose_dot(target, pairs_bounded(arr.reshape(m, -1))) if i == 1 else None
        return pack_rows(key, i, arr, dot, _zp_enc(key, dot) if dot else 0)
    if i == 1 and direct_ok(key, target):
        dot = choose_dot(target, False)
        layout, rows = _pack_broadcast_rows(_conv_rows(arr, dot.per_unit), dot, DIRECT)
        return layout, np.concatenate([rows, kernel_row_sums(arr).view(np.uint8).reshape(-1)])
    if i == 1 and _conv_gemm_ok(key):
        deep = math.prod(arr.shape[1:]) >= target.tuning.amx_min_depth
        dot = choose_dot(target, pairs_bounded(_gemm_rows(key, arr, 4)), tiles=deep)
        prefix = TAPS if taps_ok(key, dot.per_unit) else QUADS
        return _pack_broadcast_rows(_gemm_rows(key, arr, dot.per_unit), dot, prefix)
    if dwrows_ok(key, target):
        dot = choose_dot(target, False)
        return pack_dwrows(key, i, arr, dot, _zp_enc(key, dot))
    if lanes_ok(key, target):
        return pack_lanes(key, i, arr, target)
    return None


def _zp_enc(key: KernelKey, dot: Dot) -> int:
    """The activations' zero point in the encoding ``dot`` reads."""
    return dict(key.attrs)["x_zero_point"] + encoding(key.in_types[0].dtype, dot)[1]


def _lanes_packed(key: KernelKey) -> bool:
    """Depthwise with channels in lanes: weights (and the bias, if any) packed for it."""
    return key.packed[1] == LANES and (len(key.packed) == 2 or key.packed[2] == LANES)


def _gemm_rows(key: KernelKey, arr: np.ndarray, per_unit: int) -> np.ndarray:
    """The conv's weights as GEMM rows: taps sharing units when channels are fewer than a unit."""
    return taps_rows(arr, per_unit) if taps_ok(key, per_unit) else _conv_rows(arr, per_unit)


def _pack_broadcast_rows(rows: np.ndarray, dot: Dot, prefix: str = QUADS):
    """Weights as broadcast rows: [row sums, int32, 64-byte padded][rows x k4 units]."""
    m, k = rows.shape
    k4 = -(-k // dot.per_unit)
    quads = np.zeros((m, dot.per_unit * k4), dot.unit_dtype)
    quads[:, :k] = rows
    sums = np.zeros(sums_bytes(m) // 4, np.int32)
    sums[:m] = rows.astype(np.int64).sum(axis=1)
    return prefix + dot.kind, np.concatenate([sums.view(np.uint8), quads.view(np.uint8).reshape(-1)])


@dataclass(frozen=True)
class _ConvPlan:
    """The GEMM of a conv and its two scratch regions: the input as channel units, the im2col."""

    geo: GemmGeometry
    cu: int  # channel units (4-byte: quads, or int16 pairs)
    per_unit: int  # channels in a unit
    taps: int
    direct: bool  # 1x1, stride 1, no padding: the channel units are the GEMM's operand

    @property
    def quads_bytes(self) -> int:
        return 4 * self.cu * (self.geo.cols_pad if self.direct else self.plane)

    plane: int = 0  # H * W of the input

    @property
    def cols_offset(self) -> int:
        return -(-self.quads_bytes // 64) * 64

    @property
    def scratch(self) -> int:
        return self.cols_offset + (0 if self.direct else 4 * self.geo.k4 * self.geo.cols_pad) + 64


def _conv_plan(key: KernelKey, dot: Dot) -> _ConvPlan:
    _, c, hh, ww = key.in_types[0].shape
    m, _, kh, kw = key.in_types[1].shape
    oh, ow = key.out_types[0].shape[2:]
    r0, r1 = out_rows(key)
    p = (r1 - r0) * ow
    cu, taps = -(-c // dot.per_unit), kh * kw
    direct = _units_are_columns(key) and (r0, r1) == (0, oh)
    geo = GemmGeometry(rows=m, cols=p, cols_pad=padded_cols(p, dot), k4=taps * cu, vec_is_u=True)
    return _ConvPlan(geo, cu, dot.per_unit, taps, direct, hh * ww)


def out_rows(key: KernelKey) -> tuple[int, int]:
    """The output rows a conv's kernel computes: a part's ``BLOCKS`` (``split.qconv_parts``), else all."""
    return dict(key.attrs).get(BLOCKS) or (0, key.out_types[0].shape[2])


def im2col_rows_ok(key: KernelKey, target: Target) -> bool:
    """The packer gives this conv (``key`` as it sees it) the im2col GEMM of channel units (``_pack_layout``'s
    order), whose parts may be ranges of output rows: each builds only its rows' columns."""
    if key.packed[1] != "const" or not _conv_gemm_ok(key) or key.in_types[1].shape[1] < 4:  # fewer: taps in units
        return False
    if winograd_ok(key, target) or rows_ok(key, target) or direct_ok(key, target):
        return False
    return not _units_are_columns(key)


def _units_are_columns(key: KernelKey) -> bool:
    """A 1x1 stride-1 unpadded conv: the input's channel units are the GEMM's columns as they lie (no im2col)."""
    a = dict(key.attrs)
    return math.prod(key.in_types[1].shape[2:]) == 1 and tuple(a["strides"]) == (1, 1) and not any(a["pads"])


def _qconv_scratch(key: KernelKey, target: Target) -> int:
    if key.packed[1] == F2X2_LAYOUT:
        return winograd_scratch(key, target)
    rows = dot_of(key, target, ROWS)
    if rows is not None:
        return rows_scratch(key, rows)
    dw = dot_of(key, target, DWROWS)
    if dw is not None:
        return dwrows_scratch(key, dw)
    taps = dot_of(key, target, TAPS)
    if taps is not None:
        return taps_scratch(key, taps)
    in_place = dot_of(key, target, DIRECT)
    if in_place is not None:
        return direct_scratch(key, in_place)
    dot = dot_of(key, target)
    if _lanes_packed(key):
        return lanes_scratch(key, target)
    if dot is None or not _conv_gemm_ok(key):
        return grouped_scratch(key)
    return _conv_plan(key, dot).scratch


def _fill_word(fill: int, per_unit: int) -> ir.Constant:
    """A unit of zero points: ``fill`` (an encoded byte) in each of its elements."""
    bits = 32 // per_unit
    word = sum(fill << (bits * j) for j in range(per_unit))
    return h.const(h.I32, word - (1 << 32 if word >= 1 << 31 else 0))


def _channel_quads(ctx: KernelContext, plan: _ConvPlan, n: ir.Value, flip: bool, fill: int) -> ir.Value:
    """scratch[cu][p] = the unit of the encoded channels per*cu.. at pixel p (missing: zp)."""
    b = ctx.b
    c = ctx.shape(0)[1]
    stride = plan.geo.cols_pad if plan.direct else plan.plane
    dst = b.bitcast(ctx.scratch, h.I32.as_pointer())
    x_img = gep(b, ctx.ins[0], b.mul(n, h.i64(c * plan.plane)))

    per, bits = plan.per_unit, 32 // plan.per_unit

    def quad(q: ir.Value, channels: int) -> None:
        """Channel unit q (its first ``channels`` channels real, the rest the zero point)."""
        first = b.mul(q, h.i64(per * plan.plane))
        with h.for_range(b, plan.plane, name="px") as px:
            word = h.const(h.I32, 0)
            for j in range(per):
                if j < channels:
                    v = h.load(b, x_img, b.add(first, b.add(px, h.i64(j * plan.plane))))
                    v = b.xor(v, ir.Constant(h.I8, 0x80)) if flip else v
                else:
                    v = ir.Constant(h.I8, fill)
                word = b.or_(word, b.shl(b.zext(v, h.I32), h.const(h.I32, bits * j)))
            h.store(b, word, dst, b.add(px, b.mul(q, h.i64(stride))))

    with h.for_range(b, c // per, name="cq") as q:
        quad(q, per)
    if c % per:
        quad(h.i64(c // per), c % per)
    return dst


def _im2col_quads(ctx: KernelContext, plan: _ConvPlan, quads: ir.Value, fill: int) -> ir.Value:
    """cols[tap * cu + q][p] = channel unit q at pixel p's tap (zp units in the padding).

    Each tap's in-bounds output columns are known when compiling: a row is zp units, a copy of the
    input row (one memcpy at stride 1), zp units; rows above or below the input are zp units."""
    a, b = ctx.attrs, ctx.b
    _, _, hh, ww = ctx.shape(0)
    _, _, _, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw), pads = a["strides"], a["dilations"], a["pads"]
    cols = b.bitcast(gep(b, ctx.scratch, plan.cols_offset), h.I32.as_pointer())
    zq = _fill_word(fill, plan.per_unit)

    def zp_run(start: ir.Value, lo: int, hi: int) -> None:
        if hi > lo:
            with h.for_range(b, hi, start=lo, name="zx") as ox:
                h.store(b, zq, cols, b.add(start, ox))

    r0, r1 = out_rows(ctx.key)
    for tap in range(plan.taps):
        ty, tx = divmod(tap, kw)
        lo, hi = valid_span(ow, sw, tx * dw - pads[1], ww)
        with h.for_range(b, plan.cu, name="q") as q:
            src0 = b.mul(q, h.i64(plan.plane))
            dst0 = b.mul(b.add(q, h.i64(tap * plan.cu)), h.i64(plan.geo.cols_pad))
            with h.for_range(b, r1 - r0, name="oy") as j:
                iy = b.add(b.mul(b.add(j, h.i64(r0)), h.i64(sh)), h.i64(ty * dh - pads[0]))
                out_row = b.add(dst0, b.mul(j, h.i64(ow)))
                with b.if_else(b.icmp_unsigned("<", iy, h.i64(hh))) as (inside, outside):
                    with inside:
                        zp_run(out_row, 0, lo)
                        src = b.add(b.add(src0, b.mul(iy, h.i64(ww))), h.i64(lo * sw + tx * dw - pads[1]))
                        if sw == 1 and hi > lo:
                            h.memcpy(b, gep(b, cols, b.add(out_row, h.i64(lo))), gep(b, quads, src), 4 * (hi - lo))
                        elif hi > lo:
                            with h.for_range(b, hi - lo, name="ox") as j:
                                v = h.load(b, quads, b.add(src, b.mul(j, h.i64(sw))))
                                h.store(b, v, cols, b.add(out_row, b.add(j, h.i64(lo))))
                        zp_run(out_row, hi, ow)
                    with outside:
                        zp_run(out_row, 0, ow)
    return b.bitcast(cols, h.I8P)


def _qconv_gemm(ctx: KernelContext, dot: Dot, taps: bool = False, in_place: bool = False) -> None:
    """The im2col GEMM; with ``taps``, units of neighbouring taps (``quant_taps.py``); ``in_place``:
    the taps read in place (``quant_direct.py``)."""
    a, b = ctx.attrs, ctx.b
    plan = _conv_plan(ctx.key, dot)
    geo = taps_geometry(ctx.key, dot) if taps else plan.geo
    n_img, m = ctx.out_shape[0], ctx.out_shape[1]
    flip, shift = encoding(ctx.in_types[0].dtype, dot)
    zp_enc = a["x_zero_point"] + shift
    fill = zp_enc & 0xFF
    sums = b.bitcast(ctx.ins[1], h.I32.as_pointer())
    wq = gep(b, ctx.ins[1], sums_bytes(m))
    bias = ctx.ins[2] if len(ctx.in_types) == 3 else None
    mults = multipliers(ctx)
    plane_out = math.prod(ctx.out_shape[2:])
    first = out_rows(ctx.key)[0] * ctx.out_shape[3]  # a part of output rows (``im2col_rows_ok``): its first pixel
    with h.for_range(b, n_img, name="n") as n:
        out_img = gep(b, ctx.outs[0], b.add(b.mul(n, h.i64(m * plane_out)), h.i64(first)))
        epi = requant_epilogue(ctx, a, mults, True, sums, bias, zp_enc,
                                lambda bb, row: gep(bb, out_img, bb.mul(row, h.i64(plane_out))), geo.cols, dot)
        if in_place:
            row_sums = gep(b, wq, m * geo.k4 * 4)  # after the broadcast rows (``_pack_qconv``)
            emit_direct_qconv(ctx, dot, n, flip, zp_enc, wq, b.bitcast(row_sums, h.I32.as_pointer()), epi)
        else:
            if taps:
                vptr = emit_taps_im2col(ctx, dot, n, flip, fill, _fill_word(fill, dot.per_unit))
            else:
                quads = _channel_quads(ctx, plan, n, flip, fill)
                vptr = b.bitcast(quads, h.I8P) if plan.direct else _im2col_quads(ctx, plan, quads, fill)
            emit_int_gemm(b, dot, ctx.target, geo, wq, vptr, epi)


def _qconv_rows(ctx: KernelContext, dot: Dot) -> None:
    plan = dataclasses.replace(_conv_plan(ctx.key, dot), direct=False)  # the rows read units at the plane's pitch
    flip, _ = encoding(ctx.in_types[0].dtype, dot)
    fill = _zp_enc(ctx.key, dot) & 0xFF
    with h.for_range(ctx.b, ctx.out_shape[0], name="n") as n:
        emit_rows_qconv(ctx, dot, _channel_quads(ctx, plan, n, flip, fill), n)


@kernel("QConv", pack=_pack_qconv, scratch=_qconv_scratch, code_key=_qconv_code)
def emit_qconv(ctx: KernelContext) -> None:
    if _carries_multipliers(ctx.key):  # the multipliers, then the weights as their path packed them
        ctx.tables[MULTIPLIERS] = ctx.b.bitcast(ctx.ins[1], h.F32.as_pointer())
        ctx.ins[1] = gep(ctx.b, ctx.ins[1], 4 * table_rows(ctx.shape(1)[0]))
    dot = dot_of(ctx.key, ctx.target)
    rows = dot_of(ctx.key, ctx.target, ROWS)
    dw = dot_of(ctx.key, ctx.target, DWROWS)
    taps = dot_of(ctx.key, ctx.target, TAPS)
    if out_rows(ctx.key) != (0, ctx.out_shape[2]) and (dot is None or not _conv_gemm_ok(ctx.key)):
        raise CompileError(f"QConv: a part of output rows for a kernel that computes them all ({ctx.key.packed[1]})")
    if ctx.key.packed[1] == F2X2_LAYOUT:
        emit_winograd_qconv(ctx)
    elif dw is not None:
        emit_dwrows_qconv(ctx, dw, encoding(ctx.in_types[0].dtype, dw)[0], _zp_enc(ctx.key, dw))
    elif rows is not None:
        _qconv_rows(ctx, rows)
        set_fn_attrs(ctx.b.function, strings={SLOTTED: "true"})
    elif taps is not None:
        _qconv_gemm(ctx, taps, taps=True)
    elif (in_place := dot_of(ctx.key, ctx.target, DIRECT)) is not None:
        _qconv_gemm(ctx, in_place, in_place=True)
        set_fn_attrs(ctx.b.function, strings={SLOTTED: "true"})
    elif dot is not None and _conv_gemm_ok(ctx.key):
        _qconv_gemm(ctx, dot)
    elif _lanes_packed(ctx.key):
        emit_lanes_qconv(ctx)
    else:
        emit_grouped_qconv(ctx)
