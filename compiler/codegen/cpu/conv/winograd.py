"""Winograd F(m x m, 3x3), m = 2 or 4 (Lavin & Gray 2016), for 3x3 stride-1 dilation-1 group-1 convs
(dilated ones run it on their phase planes: ``dilated.py``).

Pure ``llvmlite.ir`` plus the NumPy weight transform. Same signature and epilogue as
``emit.emit_conv2d``, which dispatches here when ``plan.conv_plan`` picks ``"winograd"`` (its
``mr`` field is then m). Tiles of m x m outputs (TH x TW of them), a = m + 2, A = a*a transform
points. Vectors run along tiles, not channels, so the transforms read and write NCHW directly
(no transposes, no padded copy of the input, no channels-last output buffer):

1. Per block of tile rows and input channel: ``V[xi]`` [C, St] = (B^T d B)[xi], VL tiles at a time,
   their a x a inputs de-interleaved from VL-float loads of X rows (rows in the padding read a
   zeroed row in scratch, columns in it are masked off).
2. ``M[xi]`` [OC, St] = U[xi]^T V[xi]: register tiles with output channels as rows, U packed
   [A, ceil(OC/MR), C, MR] and broadcast (a steady stream, prefetched ahead: in the model U comes
   from DRAM), tiles as vector columns.
3. ``Y`` = A^T M A per tile vector, interleaved back into output rows, bias, residual and
   activation added, stored to NCHW.

A chunk of VL tiles is VL/TW whole tile rows where TW divides VL (ResNet's 16x16 F4, 8x8 F2), else
a segment of one tile row: lanes past the row then hold garbage that the next row's stores
overwrite (V) or the masked output stores drop. Chunks of real tiles only de-interleave within
128-bit groups, which scrambles their lane order the same way on the way in and out. Input transforms and GEMMs are one noinline helper
shared by same-shape layers of a module; each kernel adds only its output transform and epilogue.
Measured on znver3 (1 thread, in ResNet-18, U from DRAM) against the earlier channels-last version
(transposes, one GEMM per point with tiles as rows): 64x32x32 F4 1.5x, 128x16x16 F4 1.6x, 256x8x8
F2 1.4x. F4 at 256x8x8 stays slower than F2 (4 tiles fill half a vector; U 9.4 MB).

Weights: ``pack.pack_winograd_weights(W[OC, C, 3, 3], target, m, H, W, pads) -> [A, ceil(OC/MR), C, MR]``.
Geometry and the GEMM tile: ``winograd_geometry.py``.
fp32 error: F2 below the direct kernel's; F4 (0, +-1, +-1/2) up to ~2e-5 of the output range.
"""

from __future__ import annotations

from contextlib import nullcontext

from llvmlite import ir

from ....target import Target
from ...activations import apply_activation
from ..gemm import UNROLL, Out, epilogue, tile_grid
from ...irhelpers import I1, I64, for_range, gep, i64, memset0, prefetch as h_prefetch, vector
from ...mathfns import fma
from ..vecops import F32P, broadcast, define_helper, load_vec, store_vec, vec_type
from .winograd_geometry import WinogradGeometry, winograd_gemm_tile
from .winograd_math import MATS, sandwich, unzip_groups, unzip_lanes, zip_groups, zip_lanes
def emit_winograd(fn: ir.Function, target: Target, N: int, C: int, H: int, W: int, OC: int, pads, *,
                  bias: bool, residual: bool, activation: str, act_alpha: float, act_beta: float, m: int = 2,
                  blocks: tuple | None = None) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel, no blocks yet). ``blocks``: run only
    blocks ``[first, end)`` of tile rows, the arguments of a body the parts of a layer split by rows share
    (``emit._ranged_body``, which checks constant ones); default all."""
    vl = target.vector_floats
    g = WinogradGeometry.for_tuning(vl, C, H, W, OC, pads, m, target.tuning)
    mr, nv = winograd_gemm_tile(target, g, OC)
    X, Up, bias_p, res_p, Y, scratch = fn.args[:6]
    key = f"{C}x{H}x{W}_{OC}_p{'_'.join(map(str, pads))}_{target.vector_bits}_f{m}_{mr}x{nv}_b{g.TRB}"
    front = define_helper(fn.module, f"winograd_front_{key}", target, [F32P, F32P, F32P, I64],
                    lambda b, f: _front(b, f, vl, g, C, H, W, OC, pads, mr, nv, target.tuning.winograd_prefetch_bytes))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    P = g.OH * g.OW
    ep = {"bias": bias_p if bias else None, "activation": activation, "alpha": act_alpha, "beta": act_beta,
          "scalar_tails": not target.tuning.masked_stores}
    with for_range(b, N, name="n") as n:
        xn = gep(b, X, b.mul(n, i64(C * H * W)))
        yn = gep(b, Y, b.mul(n, i64(OC * P)))
        rn = gep(b, res_p, b.mul(n, i64(OC * P))) if residual else None
        first, end = blocks or (0, g.nblk)
        with for_range(b, end, start=first, name="blk") as blk:
            b.call(front, [xn, Up, scratch, blk])
            _output(b, vl, g, OC, gep(b, scratch, g.m_off), blk, yn, rn, ep)
    b.ret_void()


def _block_rows(b, g, blk):
    lo = b.mul(blk, i64(g.TRB))
    hi = b.add(lo, i64(g.TRB))
    return lo, b.select(b.icmp_signed("<", hi, i64(g.TH)), hi, i64(g.TH))


def _loads(g) -> list[tuple[int, int]]:
    """(tile row, tile column) within its chunk of each of the m loads that cover a chunk's VL tiles."""
    k = g.per_load
    if g.R > 1:
        return [(q * k // g.TW, q * k % g.TW) for q in range(g.m)]
    return [(0, q * k) for q in range(g.m)]


def _owned(g, tj0) -> bool:
    """Whether every lane of the chunk at tile column tj0 is a real tile (runtime tj0: an interior
    chunk, always). Such chunks may scramble their lanes; a row's partial last chunk keeps them in
    order, so the garbage lanes it writes past the row are the ones the next row overwrites."""
    return g.R > 1 or not isinstance(tj0, int) or tj0 + g.per_load * g.m <= g.TW


def _chunks(g, interior) -> list:
    """Chunks of a tile row (tile columns from j*VL): each j where ``interior(j)`` fails (the row's
    ends: masks known) on its own, then (first, count) of the loop over the interior ones."""
    if g.R > 1:
        return [0]
    inner = [j for j in range(g.nch) if interior(j)]
    edges = [j for j in range(g.nch) if j not in inner]
    return edges + ([(inner[0], len(inner))] if len(inner) > 1 else inner)


def _front(b, fn, vl, g, C, H, W, OC, pads, mr, nv, prefetch) -> None:
    """Block ``blk`` of tile rows: input transform of one image into V, then the A GEMMs into M."""
    X, Up, scratch, blk = fn.args
    m, a, TW, St, pt, pl = g.m, g.a, g.TW, g.St, pads[0], pads[1]
    V, M = gep(b, scratch, g.v_off), gep(b, scratch, g.m_off)
    BT = MATS[m][0]
    memset0(b, scratch, 4 * g.zlen)
    lo, hi = _block_rows(b, g, blk)
    loads = _loads(g)

    def ld(rows, tj0, q, shift):
        """Load q (of m) of a chunk's row, its start shifted by ``shift`` pixels."""
        s, tc = loads[q]
        if isinstance(tj0, int):
            c0 = m * (tj0 + tc) + shift - pl
            lanes = [0 <= c0 + k < W for k in range(vl)]
            if not any(lanes):
                return vector(vec_type(vl), None)
            mask = None if all(lanes) else vector(ir.VectorType(I1, vl), lanes)
            return load_vec(b, gep(b, rows[s], c0), vl, mask)
        col = b.add(b.mul(tj0, i64(m)), i64(m * tc + shift - pl))
        return load_vec(b, gep(b, rows[s], col), vl)

    def chunk(xc, tis, tj0, dst):
        """V for the VL tiles at tile rows ``tis`` (one per load row), columns from tj0 (int: masks known)."""
        unzip = unzip_groups if _owned(g, tj0) else unzip_lanes
        d = []
        for r in range(a):
            rows = []
            for ti in tis:
                y = b.add(b.mul(ti, i64(m)), i64(r - pt))
                p = b.gep(xc, [b.mul(y, i64(W))])  # not inbounds: only selected inside the image
                rows.append(b.select(b.icmp_unsigned("<", y, i64(H)), p, scratch))
            d.append(unzip(b, [ld(rows, tj0, q, 0) for q in range(m)])
                     + unzip(b, [ld(rows, tj0, q, m) for q in range(m)])[: a - m])
        out = sandwich(b, vl, BT, BT, d)
        for i in range(a):
            for k in range(a):
                store_vec(b, out[i][k], gep(b, dst, (i * a + k) * g.vs))

    def interior(j):  # every load of chunk j inside the image row
        return j * m * vl - pl >= 0 and (j + 1) * m * vl + m - pl <= W

    with for_range(b, C, name="ic") as c:
        xc = gep(b, X, b.mul(c, i64(H * W)))
        vc = gep(b, V, b.mul(c, i64(St)))
        with for_range(b, hi, start=lo, step=g.R, name="it") as ti:
            vrow = gep(b, vc, b.mul(b.sub(ti, lo), i64(TW)))
            tis = [b.add(ti, i64(s)) for s in range(g.R)]
            for j in _chunks(g, interior):
                if isinstance(j, tuple):
                    with for_range(b, j[0] + j[1], start=j[0], name="ij") as jj:
                        tj0 = b.mul(jj, i64(vl))
                        chunk(xc, tis, tj0, gep(b, vrow, tj0))
                else:
                    chunk(xc, tis, j * vl, gep(b, vrow, j * vl))
    _gemms(b, vl, g, C, OC, mr, nv, Up, V, M, prefetch)


def _gemms(b, vl, g, C, OC, mr, nv, Up, V, M, prefetch) -> None:
    """M[xi] = U[xi]^T V[xi] for every point, rows (output channels) outer: each MR x C panel of U is
    loaded once per block and reused from L1 across the tile columns (columns outer measured the
    same on 64-channel layers up to 112x112, where U is the smaller operand)."""
    St, nb = g.St, -(-OC // mr)
    with for_range(b, g.A, name="xi") as xi:
        Ax = gep(b, Up, b.mul(xi, i64(nb * mr * C)))
        Bx, Cx = gep(b, V, b.mul(xi, i64(g.vs))), gep(b, M, b.mul(xi, i64(g.ms)))

        def slot_fn(b, s, is_partial):
            col = b.mul(s, i64(vl))
            return gep(b, Bx, col), col, None

        def tile_fn(b, row0, mr_eff, slots):
            out = Out(gep(b, Cx, b.mul(row0, i64(St))), St, [s[1] for s in slots], [None] * len(slots))
            _tile(b, vl, mr_eff, mr, gep(b, Ax, b.mul(row0, i64(C))), [s[0] for s in slots], C, St, out, prefetch)
        tile_grid(b, OC, mr, g.slots, False, nv, slot_fn, tile_fn, rows_outer=True)


def _tile(b, vl, rows, MR, a_ptr, b_ptrs, K, ldb, out, prefetch) -> None:
    """``gemm.emit_tile``'s k loop on a packed [K, MR] panel of U, plus a software prefetch of the
    panel ``prefetch`` bytes ahead (``Tuning.winograd_prefetch_bytes``): U streams from DRAM in the model, and the hardware prefetcher alone
    left 15-25% of a 128- or 256-channel layer's GEMM time waiting on it (znver3)."""
    zero = vector(vec_type(vl), None)

    def step(acc, a_base, b_bases, k):
        bv = [load_vec(b, gep(b, bb, k * ldb), vl) for bb in b_bases]
        new = []
        for r in range(rows):
            a = broadcast(b, b.load(gep(b, a_base, k * MR + r), align=4), vl)
            new.append([fma(b, a, bv[v], acc[r][v]) for v in range(len(bv))])
        return new
    acc = [[zero] * len(b_ptrs) for _ in range(rows)]
    n = K // UNROLL
    if n:
        pre = b.block
        loop, after = b.append_basic_block("wk.loop"), b.append_basic_block("wk.end")
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(I64, "wk")
        i.add_incoming(i64(0), pre)
        phis = [[b.phi(zero.type) for _ in row] for row in acc]
        for row in phis:
            for ph in row:
                ph.add_incoming(zero, pre)
        a_base = gep(b, a_ptr, b.mul(i, i64(UNROLL * MR)))
        b_bases = [gep(b, bb, b.mul(i, i64(UNROLL * ldb))) for bb in b_ptrs]
        for off in range(0, UNROLL * MR * 4, 64):
            h_prefetch(b, gep(b, a_base, (prefetch + off) // 4))
        cur = phis
        for k in range(UNROLL):
            cur = step(cur, a_base, b_bases, k)
        nxt = b.add(i, i64(1))
        i.add_incoming(nxt, b.block)
        for prow, row in zip(phis, cur):
            for ph, x in zip(prow, row):
                ph.add_incoming(x, b.block)
        b.cbranch(b.icmp_unsigned("<", nxt, i64(n)), loop, after)
        b.position_at_end(after)
        acc = cur
    for k in range(n * UNROLL, K):
        acc = step(acc, a_ptr, b_ptrs, k)
    epilogue(b, vl, acc, out)



def _output(b, vl, g, OC, M, blk, yn, rn, ep) -> None:
    """Block ``blk``: Y = A^T M A per tile vector, interleaved into output rows, epilogue, NCHW stores."""
    m, a, TW, OH, OW, St, R = g.m, g.a, g.TW, g.OH, g.OW, g.St, g.R
    AT = MATS[m][2]
    lo, hi = _block_rows(b, g, blk)
    lim = b.mul(hi, i64(m))
    lim = b.select(b.icmp_signed("<", lim, i64(OH)), lim, i64(OH))  # output rows of this block
    outs = _loads(g)

    def chunk(src, tis, tj0, yo, ro, bias):
        mv = [[load_vec(b, gep(b, src, (i * a + k) * g.ms), vl) for k in range(a)] for i in range(a)]
        ys = sandwich(b, vl, AT, AT, mv)
        for dy in range(m):
            zs = (zip_groups if _owned(g, tj0) else zip_lanes)(b, ys[dy])
            for s in range(R):
                oh = b.add(b.mul(tis[s], i64(m)), i64(dy))
                maybe_past = s > 0 or (OH % m and dy >= OH % m)  # a row past the block or the image
                with b.if_then(b.icmp_signed("<", oh, lim)) if maybe_past else nullcontext():
                    for q, (sq, tc) in enumerate(outs):
                        if sq != s:
                            continue
                        if isinstance(tj0, int):
                            n = max(0, min(vl, OW - m * (tj0 + tc)))
                            off = b.add(b.mul(oh, i64(OW)), i64(m * (tj0 + tc)))
                        else:
                            n, off = vl, b.add(b.mul(oh, i64(OW)), b.add(b.mul(tj0, i64(m)), i64(m * tc)))
                        if n:
                            _store_out(b, vl, zs[q], off, n, yo, ro, bias, ep)

    def interior(j):  # every pixel of chunk j inside the output row
        return (j + 1) * m * vl <= OW

    with for_range(b, OC, name="oc") as oc:
        bias = broadcast(b, b.load(gep(b, ep["bias"], oc), align=4), vl) if ep["bias"] is not None else None
        mo = gep(b, M, b.mul(oc, i64(St)))
        yo = gep(b, yn, b.mul(oc, i64(OH * OW)))
        ro = gep(b, rn, b.mul(oc, i64(OH * OW))) if rn is not None else None
        with for_range(b, hi, start=lo, step=R, name="ot") as ti:
            mrow = gep(b, mo, b.mul(b.sub(ti, lo), i64(TW)))
            tis = [b.add(ti, i64(s)) for s in range(R)]
            for j in _chunks(g, interior):
                if isinstance(j, tuple):
                    with for_range(b, j[0] + j[1], start=j[0], name="oj") as jj:
                        tj0 = b.mul(jj, i64(vl))
                        chunk(gep(b, mrow, tj0), tis, tj0, yo, ro, bias)
                else:
                    chunk(gep(b, mrow, j * vl), tis, j * vl, yo, ro, bias)


def _store_out(b, vl, y, off, n, yo, ro, bias, ep) -> None:
    mask = vector(ir.VectorType(I1, vl), [k < n for k in range(vl)]) if n < vl else None
    if bias is not None:
        y = b.fadd(y, bias)
    if ro is not None:
        y = b.fadd(y, load_vec(b, gep(b, ro, off), vl, mask))
    if ep["activation"] != "none":
        y = apply_activation(b, y, ep["activation"], ep["alpha"], ep["beta"])
    store_vec(b, y, gep(b, yo, off), mask, scalar_tails=ep["scalar_tails"])

