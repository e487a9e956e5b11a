"""The conv methods that are an implicit GEMM on the register tiles of ``gemm.py`` (NCHW).

Output channels are the GEMM rows (MR of them broadcast from the packed weights), output pixels
the vector columns, so NCHW output rows are stored contiguously and bias, residual and activation
are applied in registers. ``plan.conv_plan`` picks one of:

* ``direct``: B vectors are read straight from the input (1x1 stride-1: the input itself, one long
  row per channel), or from a zero-padded copy split into stride phases, so every tap of every
  stride and dilation is a contiguous vector load at a constant offset. Used when output rows
  fill vectors well.
* ``im2col``: small output rows (8x8 on AVX-512, 4x4...): pixel vectors are packed into K x VL
  panels in scratch first, so no lane is wasted.
* ``transposed``: 1x1 stride-1 convs over few pixels (MobileNet's 6x6, 3x3 tails): output
  channels along the vectors, pixels broadcast straight from X, stores transposed back to NCHW.
* ``depthwise`` (group == C == OC): per channel, tiles of whole output rows, the taps unrolled.

The other two methods have their own modules (``rows.py``, ``winograd.py``); ``emit.py`` dispatches. The
zero-bordered phase copy that direct and depthwise read is ``phase_copy.py``.
"""

from __future__ import annotations

import dataclasses
import math

from llvmlite import ir

from ....target import Target
from ...irhelpers import for_range, gep, i64, memset0
from ..gemm import KPlan, Out, emit_tile, tap_table, tile_grid
from ..vecops import lane_mask, load_vec, store_vec, vec_type
from .layout import ConvPlan
from .phase_copy import fill_copy

IM2COL_UNROLLED_COPIES = 128  # per channel; above this the im2col fill loops over row periods
IM2COL_UNROLLED_TAPS = 9  # taps unrolled in the im2col fill (3x3); larger kernels loop over a tap table


def emit_direct(fn: ir.Function, p: ConvPlan, target: Target, *, bias: bool, residual: bool, activation: str,
                act_alpha: float, act_beta: float, blocks: tuple | None = None) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel) for the depthwise, transposed,
    direct and im2col methods; ``blocks``: the bands ``[first, end)`` a banded direct conv runs (values: the
    arguments of a body its parts share), the pixel-vector slots an uncopied one runs (``ConvPlan.by_slots``,
    constants); default all."""
    X, Wp, bias_p, res_p, Y, scratch = fn.args[:6]
    N, C, group = p.N, p.C, p.group
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    P, HW = p.OH * p.OW, p.H * p.W
    if p.copy:
        memset0(b, scratch, 4 * p.copy_floats)  # borders stay zero: every channel rewrites the interior only
    epi = dict(activation=activation, act_alpha=act_alpha, act_beta=act_beta, scalar_tails=not target.tuning.masked_stores)
    if p.method == "depthwise":
        with for_range(b, N * C, name="nc") as nc:
            xc = gep(b, X, b.mul(nc, i64(HW)))
            fill_copy(b, p, xc, scratch, 1)
            w_c = gep(b, Wp, b.mul(nc if N == 1 else b.urem(nc, i64(C)), i64(p.T)))
            bias_c = gep(b, bias_p, b.urem(nc, i64(C))) if bias else None
            res_c = gep(b, res_p, b.mul(nc, i64(P))) if residual else None
            _depthwise_rows(b, p, scratch, w_c, gep(b, Y, b.mul(nc, i64(P))), bias_c, res_c, epi)
        b.ret_void()
        return
    if p.method == "transposed":
        _transposed(b, p, X, Wp, bias_p if bias else None, res_p if residual else None, Y, epi)
        b.ret_void()
        return
    im2col = gep(b, scratch, p.im2col_offset) if p.method == "im2col" else None
    if im2col is not None and P % p.vl:  # the last pixel vector's spare lanes, never filled, are read by
        # its multiplies: left as whatever the arena held (an int8 graph's bytes read as subnormal
        # floats), a 9x9 conv ran 27-38x slower
        memset0(b, gep(b, im2col, (P // p.vl) * p.K * p.vl), 4 * p.K * p.vl)
    kb = -(-p.OCg // p.mr) * p.mr * p.K  # packed weight elements per group
    with for_range(b, N * group, name="ng") as ng:
        g = b.urem(ng, i64(group)) if N > 1 else ng
        xg = gep(b, X, b.mul(ng, i64(p.Cg * HW)))
        src = xg
        if p.copy and p.band == p.OH:
            fill_copy(b, p, xg, scratch, p.Cg)
            src = scratch
        if im2col is not None:
            _fill_im2col(b, p, src, im2col)
            kp = KPlan.linear(p.K, p.mr, p.vl)
        else:
            cs, T = p.chan_stride, p.T
            if T > 1:  # channels outer, taps in an inner loop over a constant offset table
                kp = KPlan(p.Cg, T * p.mr, cs, (), taps=tuple(_tap(p, t) for t in range(T)), a_tap=p.mr)
            else:  # 1x1: UNROLL channels per loop iteration
                kp = KPlan.linear(p.Cg, p.mr, cs)
        if p.streams_weights:
            kp = dataclasses.replace(kp, a_prefetch=p.tuning.direct_prefetch_bytes)
        wg = gep(b, Wp, b.mul(g, i64(kb)))
        yg = gep(b, Y, b.mul(ng, i64(p.OCg * P)))
        bias_g = gep(b, bias_p, b.mul(g, i64(p.OCg))) if bias else None
        res_g = gep(b, res_p, b.mul(ng, i64(p.OCg * P))) if residual else None
        a_of_row = lambda b, row0: gep(b, wg, b.mul(row0, i64(p.K)))  # noqa: E731
        if p.pack_b:
            _packed_1x1(b, p, xg, wg, yg, bias_g, res_g, gep(b, scratch, p.im2col_offset + p.im2col_floats), epi)
        elif p.band < p.OH:
            _banded(b, p, xg, scratch, kp, a_of_row, yg, bias_g, res_g, epi, blocks)
        else:
            _grid(b, p, p.OCg, p.mr, im2col if im2col is not None else src, kp, a_of_row, yg, bias_g, res_g, epi,
                  slot_range=blocks)
    b.ret_void()


def _banded(b, p: ConvPlan, x, scratch, kp, a_of_row, y, bias_p, res_p, epi, blocks: tuple | None) -> None:
    """A direct conv whose copy outgrows ``Tuning.direct_band_bytes``, band of output rows by band: the
    planes of a band's input rows (its halo copied again with the next band) are copied and at once read
    by its tiles, from L2. ASPP's 32->64 3x3 stride-2 conv at 128x128 copied its 2.1 MB whole, from
    and to L3, in ~160 of its ~1010 us, and its tiles read them back from L3 too. Bands ``blocks``
    only (default all; the last band is short where the bands do not divide OH): the arguments of a body the
    parts of a layer split by rows share (``emit._ranged_body``, which checks constant ones)."""
    full, tail = divmod(p.OH, p.band)

    def band(oh0: ir.Value, rows: int) -> None:
        fill_copy(b, p, x, scratch, p.Cg, oh0, rows + p.halo)
        _grid(b, p, p.OCg, p.mr, scratch, kp, a_of_row, y, bias_p, res_p, epi, band=(oh0, rows))

    first, end = blocks or (0, None)
    stop = i64(full) if end is None else b.select(b.icmp_signed("<", end, i64(full)), end, i64(full))
    with for_range(b, stop, start=first, name="band") as i:
        band(b.mul(i, i64(p.band)), p.band)
    if tail and end is None:
        band(i64(full * p.band), tail)
    elif tail:
        with b.if_then(b.icmp_signed(">", end, i64(full))):
            band(i64(full * p.band), tail)


def _transposed(b, p: ConvPlan, X, Wp, bias_p, res_p, Y, epi) -> None:
    """1x1 conv over few pixels as Y^T[P, OC] = X^T[P, C] @ W^T: pixels are the broadcast rows
    (read straight from NCHW X), output channels the vectors; stores go back out transposed."""
    vl, P, Cg, OCg = p.vl, p.OH * p.OW, p.Cg, p.OCg
    kp = KPlan.linear(Cg, P, vl)
    kb = -(-OCg // vl) * Cg * vl  # packed weight elements per group
    with for_range(b, p.N * p.group, name="ng") as ng:
        g = b.urem(ng, i64(p.group)) if p.N > 1 else ng
        xg, wg = gep(b, X, b.mul(ng, i64(Cg * P))), gep(b, Wp, b.mul(g, i64(kb)))
        yg = gep(b, Y, b.mul(ng, i64(OCg * P)))
        bias_g = gep(b, bias_p, b.mul(g, i64(OCg))) if bias_p is not None else None
        res_g = gep(b, res_p, b.mul(ng, i64(OCg * P))) if res_p is not None else None

        def slot_fn(b, s, is_partial):
            return gep(b, wg, b.mul(s, i64(Cg * vl))), b.mul(s, i64(vl)), OCg % vl if is_partial else vl

        def tile_fn(b, row0, mr_eff, slots):
            out = Out(gep(b, yg, row0), 1, [s[1] for s in slots], [None] * len(slots), **epi,
                      lane_stride=P, lanes=[s[2] for s in slots])
            if bias_g is not None:
                out.bias, out.bias_ptr = "col", bias_g
            if res_g is not None:
                out.residual = gep(b, res_g, row0)
            emit_tile(b, vl, mr_eff, gep(b, xg, row0), 1, [s[0] for s in slots], kp, out)

        tile_grid(b, P, p.mr, OCg // vl, OCg % vl != 0, p.nv, slot_fn, tile_fn)


def _packed_1x1(b, p: ConvPlan, x, w, y, bias_p, res_p, panel, epi) -> None:
    """1x1 direct conv, B packed: per column tile of NV pixel vectors and K block of channels, the
    vectors are copied into one contiguous panel that every row block then reads from L1.

    K blocks keep the panel within ``Tuning.panel_bytes``; the first block stores acc + bias + residual,
    later ones add the partial sums already in Y, and only the last applies the activation.
    """
    vl, mr, P, HW, kc = p.vl, p.mr, p.OH * p.OW, p.H * p.W, p.panel_k
    nkb = -(-p.Cg // kc)
    last_k0, last_len = (nkb - 1) * kc, p.Cg - (nkb - 1) * kc
    full_tiles, tail = divmod(p.slots, p.nv)
    full_rb, rt = divmod(p.OCg, mr)
    no_act = dict(epi, activation="none")

    def pack(x0, k0, klen, n):
        with for_range(b, klen, name="pk") as c:
            kk = b.add(c, k0) if isinstance(k0, ir.Value) else b.add(c, i64(k0))
            src, dst = gep(b, x0, b.mul(kk, i64(HW))), gep(b, panel, b.mul(c, i64(n * vl)))
            for v in range(n):
                store_vec(b, load_vec(b, gep(b, src, v * vl), vl), gep(b, dst, v * vl))

    def tile(row0, m, k0, kp, c_offs, first, last):
        yr = gep(b, y, b.mul(row0, i64(P)))
        out = Out(yr, P, c_offs, [None] * len(c_offs), **(epi if last else no_act))
        if not first:
            out.bias, out.bias_ptr = "full", yr
        else:
            if bias_p is not None:
                out.bias, out.bias_ptr = "row", gep(b, bias_p, row0)
            if res_p is not None:
                out.residual = gep(b, res_p, b.mul(row0, i64(P)))
        k_off = b.mul(k0, i64(mr)) if isinstance(k0, ir.Value) else i64(k0 * mr)
        a = gep(b, w, b.add(b.mul(row0, i64(p.K)), k_off))
        emit_tile(b, vl, m, a, 1, [gep(b, panel, v * vl) for v in range(len(c_offs))], kp, out)

    def k_block(x0, c_offs, k0, klen, first, last):
        n = len(c_offs)
        pack(x0, k0, klen, n)
        kp = KPlan.linear(klen, mr, n * vl)
        if full_rb:
            with for_range(b, full_rb, name="rb") as ib:
                tile(b.mul(ib, i64(mr)), mr, k0, kp, c_offs, first, last)
        if rt:
            tile(i64(full_rb * mr), rt, k0, kp, c_offs, first, last)

    def column_tile(s0, n):
        pix0 = b.mul(s0, i64(vl))
        x0, c_offs = gep(b, x, pix0), [b.add(pix0, i64(v * vl)) for v in range(n)]
        k_block(x0, c_offs, 0, min(kc, p.Cg), True, nkb == 1)
        if nkb > 2:
            with for_range(b, nkb - 2, name="kb") as j:
                k_block(x0, c_offs, b.mul(b.add(j, i64(1)), i64(kc)), kc, False, False)
        if nkb > 1:
            k_block(x0, c_offs, last_k0, last_len, False, True)

    if full_tiles:
        with for_range(b, full_tiles, name="ct") as jt:
            column_tile(b.mul(jt, i64(p.nv)), p.nv)
    if tail:
        column_tile(i64(full_tiles * p.nv), tail)


def _depthwise_rows(b, p: ConvPlan, src, w_c, y, bias_c, res_c, epi) -> None:
    """One channel: tiles of whole output rows (or row chunks), so every vector's offset and mask
    is a constant and the per-tile overhead stays small next to its KH*KW*NV FMAs."""
    vl, vpr = p.vl, p.vpr
    cols = min(vpr, p.nv)
    rows = max(1, p.nv // vpr) if vpr <= p.nv else 1
    chunks = [(j0, min(cols, vpr - j0)) for j0 in range(0, vpr, cols)]
    tail = lane_mask(vl, p.OW % vl) if p.OW % vl else None
    kp = KPlan(0, 0, 0, (), tuple((t, _tap(p, t)) for t in range(p.T)))

    def tile(oh0: ir.Value, nrows: int) -> None:
        sb, yo = gep(b, src, b.mul(oh0, i64(p.Wq))), b.mul(oh0, i64(p.OW))
        for j0, nc in chunks:
            vecs = [(i, j) for i in range(nrows) for j in range(j0, j0 + nc)]
            out = Out(y, 0, [b.add(yo, i64(i * p.OW + j * vl)) for i, j in vecs],
                      [tail if j == vpr - 1 else None for _, j in vecs], residual=res_c, **epi)
            if bias_c is not None:
                out.bias, out.bias_ptr = "row", bias_c
            emit_tile(b, vl, 1, w_c, 1, [gep(b, sb, i * p.Wq + j * vl) for i, j in vecs], kp, out)

    full, rest = divmod(p.OH, rows)
    with for_range(b, full, name="dr") as t:
        tile(b.mul(t, i64(rows)), rows)
    if rest:
        tile(i64(full * rows), rest)


def _tap(p: ConvPlan, t: int) -> int:
    return p.tap_offset(t // p.KW, t % p.KW)


def _grid(b, p: ConvPlan, rows, mr, src, kp, a_of_row, y, bias_ptr, res_ptr, epi, band=None, slot_range=None) -> None:
    """The tile loops over output rows (channels) x pixel slots, and one micro-kernel per tile;
    ``band``: (first output row, rows) of a band whose planes in ``src`` start at its first row;
    ``slot_range``: [first, end) of the pixel slots of an uncopied conv (a part of it), default all."""
    vl, P = p.vl, p.OH * p.OW
    s_base = None
    if p.method == "im2col":
        def slot_fn(b, s, is_partial):
            mask = lane_mask(vl, P % vl) if is_partial else None
            return gep(b, src, b.mul(s, i64(p.K * vl))), b.mul(s, i64(vl)), mask
        n_slots, partial = P // vl, P % vl != 0
    else:
        tail = lane_mask(vl, p.OW % vl) if p.OW % vl else None

        def slot_fn(b, s, is_partial):
            if p.vpr == 1:
                oh, vc, mask = s, None, tail
            else:
                oh = b.udiv(s, i64(p.vpr))
                vc = b.mul(b.sub(s, b.mul(oh, i64(p.vpr))), i64(vl))
                mask = None if tail is None else b.select(
                    b.icmp_unsigned("==", vc, i64((p.vpr - 1) * vl)), tail, lane_mask(vl, vl))
            b_off, c_off = b.mul(oh if band is None else b.sub(oh, band[0]), i64(p.Wq)), b.mul(oh, i64(p.OW))
            if vc is not None:
                b_off, c_off = b.add(b_off, vc), b.add(c_off, vc)
            return gep(b, src, b_off), c_off, mask
        n_slots, partial = (p.slots if band is None else band[1] * p.vpr), False
        s_base = None if band is None else b.mul(band[0], i64(p.vpr))
        if slot_range is not None:
            n_slots, s_base = slot_range[1] - slot_range[0], i64(slot_range[0])

    def tile_fn(b, row0, mr_eff, slots):
        out = Out(gep(b, y, b.mul(row0, i64(P))), P, [s[1] for s in slots], [s[2] for s in slots], **epi)
        if bias_ptr is not None:
            out.bias, out.bias_ptr = "row", gep(b, bias_ptr, row0)
        if res_ptr is not None:
            out.residual = gep(b, res_ptr, b.mul(row0, i64(P)))
        emit_tile(b, vl, mr_eff, a_of_row(b, row0), 1, [s[0] for s in slots], kp, out)

    tile_grid(b, rows, mr, n_slots, partial, p.nv, slot_fn, tile_fn, rows_outer=p.rows_outer and rows > 1,
              s_base=s_base)



def _fill_im2col(b: ir.IRBuilder, p: ConvPlan, src: ir.Value, dst: ir.Value) -> None:
    """dst[slot][k][lane] = pixel (slot*VL + lane) of tap row k, copied as whole row pieces.

    The split of output rows into vector pieces repeats every VL/gcd(OW, VL) rows, so one period
    is unrolled inside a loop over periods: fully unrolled, the small CNN's 28x28 first conv was
    1,134 copies (6.8k IR lines, ~3.4 s of LLVM) for the same loads and stores; now ~0.1 s.
    """
    vl, K = p.vl, p.K
    period = vl // math.gcd(p.OW, vl)
    if len(_row_pieces(p, p.OH)) * p.T <= IM2COL_UNROLLED_COPIES:
        period = p.OH  # small: one straight-line block, as fast to compile and no loop overhead
    reps, rest = divmod(p.OH, period)
    with for_range(b, p.Cg, name="kc") as c:
        sc = gep(b, src, b.mul(c, i64(p.chan_stride)))
        dk = gep(b, dst, b.mul(c, i64(p.T * vl)))
        if reps:
            with for_range(b, reps, name="kr") as r:
                s0 = gep(b, sc, b.mul(r, i64(period * p.Wq)))
                d0 = gep(b, dk, b.mul(r, i64(period * p.OW // vl * K * vl)))
                _copy_pieces(b, p, s0, d0, _row_pieces(p, period))
        if rest:
            oh0 = reps * period
            _copy_pieces(b, p, gep(b, sc, oh0 * p.Wq), gep(b, dk, oh0 * p.OW // vl * K * vl), _row_pieces(p, rest))


def _row_pieces(p: ConvPlan, rows: int) -> list[tuple[int, int, int]]:
    """(src offset minus tap, dst offset minus k*vl, length) of ``rows`` output rows, relative to a
    first row whose first pixel starts a vector."""
    vl, K, pieces = p.vl, p.K, []
    for oh in range(rows):
        ow = 0
        while ow < p.OW:
            pix = oh * p.OW + ow
            n = min(p.OW - ow, vl - pix % vl)
            pieces.append((oh * p.Wq + ow, (pix // vl) * K * vl + pix % vl, n))
            ow += n
    return pieces


def _copy_pieces(b: ir.IRBuilder, p: ConvPlan, sc: ir.Value, dk: ir.Value, pieces) -> None:
    """The pieces of every tap; past IM2COL_UNROLLED_TAPS taps, a loop over a constant tap-offset
    table (a 10x4 kernel unrolled was 40 copies of every piece: 0.3 MB of IR, ~2 s of LLVM)."""
    def copy(src: ir.Value, dst: ir.Value) -> None:
        for s_off, d_off, n in pieces:
            vt = vec_type(n) if n > 1 else ir.FloatType()
            v = b.load(b.bitcast(gep(b, src, s_off), vt.as_pointer()), align=4)
            b.store(v, b.bitcast(gep(b, dst, d_off), vt.as_pointer()), align=4)

    if p.T <= IM2COL_UNROLLED_TAPS:
        for t in range(p.T):
            copy(gep(b, sc, _tap(p, t)), gep(b, dk, t * p.vl))
        return
    table = tap_table(b.module, tuple(_tap(p, t) for t in range(p.T)))
    with for_range(b, p.T, name="kt") as t:
        off = b.load(b.gep(table, [i64(0), t], inbounds=True))
        copy(b.gep(sc, [off], inbounds=True), b.gep(dk, [b.mul(t, i64(p.vl))], inbounds=True))
