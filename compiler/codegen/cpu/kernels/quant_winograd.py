"""3x3 stride-1 QConv by Winograd F(2x2, 3x3) on AVX2's int16 pairs (``vpmaddwd``), exact.

Without VNNI a multiply instruction adds 16 products; F(2x2, 3x3) makes a 2x2 output tile from 16
products per channel pair instead of 36. Every step is integer arithmetic, so the result equals the
reference bit for bit:

* the weights become ``U = (2G) g (2G)^T`` (four times the textbook transform, so integers):
  ``|U| <= 9 * 128``, int16;
* the centred input ``d = x - zp`` (``|d| <= 255``, padding 0) becomes ``V = B^T d B``:
  ``|V| <= 4 * 255``, int16, so no pair sum of ``vpmaddwd`` saturates;
* for each of the 16 positions, one integer GEMM (:mod:`..int_gemm`) of tiles x channels by
  channels x output channels into int32 ``M``;
* ``A^T M A`` is four times the conv's sum. The int32 adds wrap, which is exact modulo 2^32, and
  the true value fits (:func:`winograd_ok` bounds the channels), so a shift by 2 gives the sum.

The input is copied once per image into a channel-last zero-bordered int16 plane of centred values
(as the depthwise lanes kernel does), so a tile's 16 values of 16 channels are 16 vector loads and
the transforms are vector adds; the output transform requantizes 8 output channels of a tile at once.
Tiles go through the three steps in blocks (:func:`block_tiles`), so that the transformed input and
``M`` of a block stay in L2 between the steps (all of ResNet-18's 32x32 layer's ``M`` is 1 MiB).
Weights ``[16][C/2][M'][2]`` int16 and the bias ``[M']`` int32 are packed at compile time.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....ops.quant import clamp_bounds
from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ...irhelpers import gep
from ..int_dot import Dot, choose_dot
from ..int_gemm import GemmGeometry, emit_int_gemm, padded_cols
from ..int_gemm import tile as gemm_tile
from .base import KernelContext, KernelKey
from .quant_units import multipliers
from .quant_depthwise import fill_centred

F2X2_LAYOUT = "wino-f2x2"
I16 = ir.IntType(16)
I16_PER_YMM = 16  # int16 lanes of a ymm register: channels in one input-transform vector
G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], np.int64)  # 2G of F(2x2, 3x3)
SUM_BOUND = 4 * 9 * 255 * 128  # |4 * sum| per input channel


def _dot(target: Target) -> Dot:
    return choose_dot(target, False)


def winograd_ok(key: KernelKey, target: Target) -> bool:
    """A 3x3 stride-1 undilated conv of one group, constant weights and bias, at least 16 input
    channels and ``int8_winograd_min_tiles`` tiles, on a target whose exact dot product is
    ``avx2-wd`` (``key`` as the packer sees it)."""
    a = dict(key.attrs)
    if len(key.in_types[0].shape) != 4 or key.packed[1] != "const" or _dot(target).kind != "avx2-wd":
        return False
    if len(key.in_types) == 3 and key.packed[2] != "const":
        return False
    c = key.in_types[0].shape[1]
    oh, ow = key.out_types[0].shape[2:]
    return (a["group"] == 1 and tuple(key.in_types[1].shape[2:]) == (3, 3) and tuple(a["strides"]) == (1, 1)
            and tuple(a["dilations"]) == (1, 1) and c >= I16_PER_YMM and SUM_BOUND * c < 2**31
            and _tiles(oh, ow)[2] >= target.tuning.int8_winograd_min_tiles)


def _tiles(oh: int, ow: int) -> tuple[int, int, int]:
    th, tw = -(-oh // 2), -(-ow // 2)
    return th, tw, th * tw


def _channels(key: KernelKey) -> int:
    return -(-key.in_types[0].shape[1] // I16_PER_YMM) * I16_PER_YMM


def _out_pad(key: KernelKey, target: Target) -> int:
    return padded_cols(key.in_types[1].shape[0], _dot(target))


def pack_winograd(key: KernelKey, i: int, arr: np.ndarray, target: Target) -> tuple[str, np.ndarray] | None:
    m, mp, cp = key.in_types[1].shape[0], _out_pad(key, target), _channels(key)
    if i == 1:
        u = np.einsum("ik,mckl,jl->ijcm", G2, arr.astype(np.int64), G2).reshape(16, arr.shape[1], m)
        out = np.zeros((16, cp, mp), "<i2")
        out[:, : arr.shape[1], :m] = u
        return F2X2_LAYOUT, np.ascontiguousarray(out.reshape(16, cp // 2, 2, mp).transpose(0, 1, 3, 2))
    if i == 2:
        out = np.zeros(mp, np.int32)
        out[:m] = arr
        return F2X2_LAYOUT, out
    return None


def _dims(key: KernelKey) -> tuple[int, int, int, int]:
    th, tw, _ = _tiles(*key.out_types[0].shape[2:])
    pads = dict(key.attrs)["pads"]
    return 2 * th + 2, 2 * tw + 2, pads[0], pads[1]


def block_tiles(key: KernelKey, target: Target) -> int:
    """Tiles per block: whole GEMM row tiles whose ``M`` fits ``Tuning.int8_winograd_block_bytes`` or the weights' bytes,
    whichever is more (each block reads all the weights again), at most all tiles. ResNet-18 at
    x86-avx2 on Zen 4: the 64-channel 32x32 convs (1 MiB of M, 128 KiB of weights) 771 -> 713 k
    cycles in blocks of 30 tiles; the 128-channel 16x16 ones (512 KiB each) no faster in blocks of 12."""
    mp, t = _out_pad(key, target), _tiles(*key.out_types[0].shape[2:])[2]
    mr, _ = gemm_tile(_dot(target), target, mp)
    budget = max(target.tuning.int8_winograd_block_bytes, 16 * _channels(key) * mp * 2)
    return min(t, max(mr, budget // (16 * 4 * mp) // mr * mr))


def _layout(key: KernelKey, target: Target) -> tuple[int, int, int]:
    """Byte offsets of the transformed input and of M (a block of tiles each) in scratch, and the scratch's size."""
    rows, cols, _, _ = _dims(key)
    cp, tb = _channels(key), block_tiles(key, target)
    v_at = -(-2 * rows * cols * cp // 64) * 64
    m_at = v_at + -(-16 * tb * cp * 2 // 64) * 64
    return v_at, m_at, m_at + 16 * tb * _out_pad(key, target) * 4 + 64


def winograd_scratch(key: KernelKey, target: Target) -> int:
    return _layout(key, target)[2]


def _bt(v: list, b: ir.IRBuilder) -> list:
    """``B^T`` of F(2x2, 3x3) along one axis: (d0 - d2, d1 + d2, d2 - d1, d1 - d3)."""
    return [b.sub(v[0], v[2]), b.add(v[1], v[2]), b.sub(v[2], v[1]), b.sub(v[1], v[3])]


def _at(v: list, b: ir.IRBuilder) -> list:
    """``A^T`` of F(2x2, 3x3) along one axis: (m0 + m1 + m2, m1 - m2 - m3)."""
    return [b.add(b.add(v[0], v[1]), v[2]), b.sub(b.sub(v[1], v[2]), v[3])]


def _input_transform(ctx: KernelContext, plane: ir.Value, vbuf: ir.Value, cols: int, cp: int, tw: int,
                     t0: ir.Value, count: int, t: int) -> None:
    """Tiles ``t0 .. t0 + count`` into ``vbuf`` ``[16][t][cp]`` (``t``: the block's tiles)."""
    b = ctx.b
    v16 = ir.VectorType(I16, I16_PER_YMM)
    with h.loop_nest(b, (count, cp // I16_PER_YMM), name="wi") as (tile, cg):
        ty, tx = b.udiv(b.add(tile, t0), h.i64(tw)), b.urem(b.add(tile, t0), h.i64(tw))
        at = b.add(h.linear(b, (ty, tx), (2 * cols * cp, 2 * cp)), b.mul(cg, h.i64(I16_PER_YMM)))
        d = [[b.load(b.bitcast(gep(b, plane, b.add(at, h.i64((i * cols + j) * cp))), v16.as_pointer()), align=2)
              for j in range(4)] for i in range(4)]
        cols_t = [_bt([d[i][j] for i in range(4)], b) for j in range(4)]  # [j][i]
        out = b.add(b.mul(tile, h.i64(cp)), b.mul(cg, h.i64(I16_PER_YMM)))
        for i in range(4):
            for j, v in enumerate(_bt([cols_t[jj][i] for jj in range(4)], b)):
                dst = gep(b, vbuf, b.add(out, h.i64((4 * i + j) * t * cp)))
                b.store(v, b.bitcast(dst, v16.as_pointer()), align=2)


def _output_transform(ctx: KernelContext, mbuf: ir.Value, img: ir.Value, t0: ir.Value, count: int, t: int, tw: int,
                      mp: int) -> None:
    """Tiles ``t0 .. t0 + count`` from ``mbuf`` ``[16][t][mp]`` (``t``: the block's tiles), requantized."""
    a, b = ctx.attrs, ctx.b
    m = ctx.out_shape[1]
    oh, ow = ctx.out_shape[2:]
    vl = _dot(ctx.target).vl
    vt, ft = ir.VectorType(h.I32, vl), ir.VectorType(h.F32, vl)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mtab, m_one = multipliers(ctx, pad=mp)
    bias = b.bitcast(ctx.ins[2], h.I32.as_pointer()) if len(ctx.in_types) == 3 else None

    def vload(ptr: ir.Value, index: ir.Value, typ: ir.VectorType) -> ir.Value:
        return b.load(b.bitcast(gep(b, ptr, index), typ.as_pointer()), align=4)

    def store_pairs(qs: list, px: ir.Value, ch: ir.Value, valid: int) -> None:
        """A tile row's two outputs of each channel as one 16-bit store (half the scattered stores)."""
        mask = h.vector(ir.VectorType(h.I32, 2 * vl), [i for lane in range(vl) for i in (lane, vl + lane)])
        pairs = b.bitcast(b.shuffle_vector(qs[0], qs[1], mask), ir.VectorType(I16, vl))
        for lane in range(valid):
            dst = b.add(b.mul(b.add(ch, h.i64(lane)), h.i64(oh * ow)), px)
            ptr = b.bitcast(gep(b, ctx.outs[0], dst), I16.as_pointer())
            b.store(b.extract_element(pairs, ir.Constant(h.I32, lane)), ptr, align=1)

    def group(tile: ir.Value, ty: ir.Value, tx: ir.Value, ch: ir.Value, valid: int) -> None:
        base = b.add(b.mul(tile, h.i64(mp)), ch)
        mv = [[vload(mbuf, b.add(base, h.i64((4 * i + j) * t * mp)), vt) for j in range(4)] for i in range(4)]
        rows = [_at([mv[i][j] for i in range(4)], b) for j in range(4)]  # [j][output row]
        mult = vload(mtab, ch, ft) if mtab is not None else h.const(ft, m_one)
        add = vload(bias, ch, vt) if bias is not None else None
        for r in range(2):
            qs = []
            for y in _at([rows[j][r] for j in range(4)], b):
                y = b.ashr(y, h.const(vt, 2))
                qs.append(qm.requantize(b, b.add(y, add) if add is not None else y, mult, a["y_zero_point"], lo, hi))
            oy = b.add(b.mul(ty, h.i64(2)), h.i64(r))
            if oh % 2 == 0 and ow % 2 == 0:
                store_pairs(qs, b.add(img, h.linear(b, (oy, b.mul(tx, h.i64(2))), (ow, 1))), ch, valid)
                continue
            for c, q in enumerate(qs):
                ox = b.add(b.mul(tx, h.i64(2)), h.i64(c))
                inside = [b.icmp_unsigned("<", v, h.i64(n)) for v, n, odd in ((oy, oh, r), (ox, ow, c)) if odd and n % 2]
                px = b.add(img, h.linear(b, (oy, ox), (ow, 1)))

                def store() -> None:
                    for lane in range(valid):
                        dst = b.add(b.mul(b.add(ch, h.i64(lane)), h.i64(oh * ow)), px)
                        h.store(b, b.extract_element(q, ir.Constant(h.I32, lane)), ctx.outs[0], dst)

                if inside:
                    cond = inside[0] if len(inside) == 1 else b.and_(inside[0], inside[1])
                    with b.if_then(cond):
                        store()
                else:
                    store()

    with h.for_range(b, count, name="wo") as tile:
        ty, tx = b.udiv(b.add(tile, t0), h.i64(tw)), b.urem(b.add(tile, t0), h.i64(tw))
        full = m // vl * vl
        if full:
            with h.for_range(b, full, step=vl, name="wm") as ch:
                group(tile, ty, tx, ch, vl)
        if m % vl:
            group(tile, ty, tx, h.i64(full), m % vl)


def emit_winograd_qconv(ctx: KernelContext) -> None:
    b = ctx.b
    n_img, c = ctx.shape(0)[:2]
    m = ctx.out_shape[1]
    oh, ow = ctx.out_shape[2:]
    _, tw, t = _tiles(oh, ow)
    dims = _dims(ctx.key)
    cp, mp = _channels(ctx.key), _out_pad(ctx.key, ctx.target)
    v_at, m_at, _ = _layout(ctx.key, ctx.target)
    dot = _dot(ctx.target)
    plane = b.bitcast(ctx.scratch, I16.as_pointer())
    vbuf = b.bitcast(gep(b, ctx.scratch, v_at), I16.as_pointer())
    mbuf = b.bitcast(gep(b, ctx.scratch, m_at), h.I32.as_pointer())
    tb = block_tiles(ctx.key, ctx.target)
    vt = dot.lanes_type

    def block(n: ir.Value, t0: ir.Value, count: int) -> None:
        _input_transform(ctx, plane, vbuf, dims[1], cp, tw, t0, count, tb)
        geo = GemmGeometry(rows=count, cols=m, cols_pad=mp, k4=cp // 2, vec_is_u=False,
                           prefetch_blocks=ctx.target.tuning.int8_winograd_prefetch_blocks)
        with h.for_range(b, 16, name="winograd.xi") as xi:
            bptr = b.bitcast(gep(b, vbuf, b.mul(xi, h.i64(tb * cp))), h.I8P)
            vptr = gep(b, b.bitcast(ctx.ins[1], h.I8P), b.mul(xi, h.i64(cp * mp * 2)))
            m_xi = gep(b, mbuf, b.mul(xi, h.i64(tb * mp)))

            def epilogue(bb: ir.IRBuilder, row: ir.Value, col, acc: ir.Value, partial: bool) -> None:
                at = bb.add(bb.mul(row, h.i64(mp)), h.i64(col) if isinstance(col, int) else col)
                bb.store(acc, bb.bitcast(gep(bb, m_xi, at), vt.as_pointer()), align=4)

            emit_int_gemm(b, dot, ctx.target, geo, bptr, vptr, epilogue)
        _output_transform(ctx, mbuf, b.mul(n, h.i64(m * oh * ow)), t0, count, tb, tw, mp)

    full = t // tb * tb
    with h.for_range(b, n_img, name="n") as n:
        fill_centred(ctx, n, plane, cp, dims)
        with h.for_range(b, full, step=tb, name="wb") as t0:
            block(n, t0, tb)
        if t > full:
            block(n, h.i64(full), t - full)

