"""Depthwise convs on narrow planes with channels in the vector lanes (``plan.conv_plan``'s ``dwlanes``).

The ``depthwise`` method puts an output row in the lanes, so a 5-wide plane (the keyword-spotting
DS-CNN's 25x5 layers) fills 5 of 8 lanes. Here each group of VL channels is copied into a
zero-bordered channel-last plane (``[row][col][VL channels]``, VL channels x VL pixels transposed in
registers; small enough to stay in L1), so every tap of an output pixel is one full vector load and
no lane computes a row's padding. A tile is VL consecutive output pixels of the group; its sums are
transposed back in registers into VL-pixel rows of the channels' NCHW planes, where the usual
epilogue adds bias and residual and applies the activation.
Weights (``pack.py``): ``[KH*KW, channels padded]``.
"""

from __future__ import annotations

from llvmlite import ir

from ...irhelpers import I32, for_range, gep, i64, memset0, vector
from ...mathfns import fma
from ..gemm import Out, acc_loop, epilogue
from ..vecops import lane_mask, load_vec, store_vec, vec_type
from .layout import ConvPlan

ROW_LOOP_TAPS = 16  # taps from which a tile loops over kernel rows (5x5 and larger; 3x3 stays unrolled)


def _lane_masks(n: int, s: int) -> tuple[list[int], list[int]]:
    """Shuffle masks pairing vectors a, b in chunks of 2s lanes: [a's first s, b's first s] and
    [a's second s, b's second s]; s = 1 interleaves pairs of lanes within each 128-bit block."""
    if s == 1:
        return ([q * 4 + e for q in range(n // 4) for e in (0, n, 1, n + 1)],
                [q * 4 + e for q in range(n // 4) for e in (2, n + 2, 3, n + 3)])
    half = list(range(s)) + [n + k for k in range(s)]
    return ([c * 2 * s + e for c in range(n // (2 * s)) for e in half],
            [c * 2 * s + s + e for c in range(n // (2 * s)) for e in half])


def transpose(b: ir.IRBuilder, vs: list) -> list:
    """VL vectors of VL lanes (VL a multiple of 4) to their VL columns: the unpack-lo/hi, 64-bit
    unpack and 128-bit block shuffles of the classic AVX transpose, 16 x log2(16) two-source shuffles
    with no register copies (the perfect-shuffle form became vpermt2ps plus a move each: the KWS layer
    took 3.8 us, not 3.5, Zen 4)."""
    n = len(vs)
    mask = ir.VectorType(I32, n)

    def pair(x, y, s):
        lo, hi = _lane_masks(n, s)
        return b.shuffle_vector(x, y, vector(mask, lo)), b.shuffle_vector(x, y, vector(mask, hi))

    t = [v for i in range(0, n, 2) for v in pair(vs[i], vs[i + 1], 1)]
    u = [v for i in range(0, n, 4) for v in pair(t[i], t[i + 2], 2) + pair(t[i + 1], t[i + 3], 2)]
    if n == 16:  # 128-bit blocks (a0, a2, b0, b2) and (a1, a3, b1, b3), twice: one vshuff32x4 each
        lo, hi = ([src * n + k * 4 + e for src, k in ((0, j), (0, j + 2), (1, j), (1, j + 2)) for e in range(4)]
                  for j in (0, 1))
        for step in (4, 8):
            w = list(u)
            for i in (i for i in range(n) if not (i // step) % 2):
                w[i] = b.shuffle_vector(u[i], u[i + step], vector(mask, lo))
                w[i + step] = b.shuffle_vector(u[i], u[i + step], vector(mask, hi))
            u = w
        return u
    s = 4
    while s < n:  # swap the off-diagonal blocks of s lanes: vectors s apart
        w = list(u)
        for i in range(n):
            if not (i // 4) & (s // 4):
                w[i], w[i + s] = pair(u[i], u[i + s], s)
        u, s = w, 2 * s
    return u


def _split(total: int, vl: int) -> list[tuple[int, int]]:
    """(whole blocks of VL, rest) as (count, size) pairs, empty ones left out."""
    return [(c, s) for c, s in ((total // vl, vl), (1, total % vl)) if c and s]


def emit_depthwise_lanes(fn: ir.Function, p: ConvPlan, *, bias: bool, residual: bool, activation: str,
                         act_alpha: float, act_beta: float, scalar_tails: bool = False) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel)."""
    X, Wp, bias_p, res_p, Y, plane = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, C, cols = p.vl, p.C, p.W + p.pl + p.pr
    P, HW = p.OH * p.OW, p.H * p.W
    zero = vector(vec_type(vl), None)
    neg_zero = vector(vec_type(vl), [-0.0] * vl)
    epi = dict(activation=activation, act_alpha=act_alpha, act_beta=act_beta, scalar_tails=scalar_tails)

    def blocks(count: int, size: int, body, name: str) -> None:
        """body(first index, size) over ``count`` blocks of ``size``, after ``first`` ones of VL."""
        for n_blk, blk in _split(count, vl):
            if blk == vl:
                with for_range(b, n_blk, name=name) as k:
                    body(b.mul(k, i64(vl)), vl)
            else:
                body(i64(count // vl * vl), blk)

    _zero_borders(b, p, plane)  # the fills rewrite the interior only
    with for_range(b, p.N, name="n") as n:
        xn = gep(b, X, b.mul(n, i64(C * HW)))

        def fill(c0: ir.Value, nc: int, q0: ir.Value, nq: int) -> None:
            """Input pixels q0 .. q0+nq of channels c0 .. c0+nc into the plane."""
            mask = lane_mask(vl, nq) if nq < vl else None
            rows = [load_vec(b, gep(b, xn, b.add(b.mul(b.add(c0, i64(c)), i64(HW)), q0)), vl, mask) for c in range(nc)]
            for j, v in enumerate(transpose(b, rows + [zero] * (vl - nc))[:nq]):
                q = b.add(q0, i64(j))
                iy = b.udiv(q, i64(p.W))
                ix = b.sub(q, b.mul(iy, i64(p.W)))
                at = b.mul(b.add(b.mul(b.add(iy, i64(p.pt)), i64(cols)), b.add(ix, i64(p.pl))), i64(vl))
                store_vec(b, v, gep(b, plane, at))

        yn = gep(b, Y, b.mul(n, i64(C * P)))
        rn = gep(b, res_p, b.mul(n, i64(C * P))) if residual else None

        def taps_of_row(c0: ir.Value, kh: ir.Value | int, ats: list, acc: list | None) -> list:
            """Each pixel's sum over kernel row kh's taps, in tap order, onto ``acc`` (None: the first row)."""
            def times(n: int) -> ir.Value:  # kh * n, a constant where kh is one (the unrolled 3x3)
                return b.mul(kh, i64(n)) if isinstance(kh, ir.Value) else i64(kh * n)

            wk, row = gep(b, Wp, b.add(c0, times(p.KW * p.lanes_channels))), times(p.dh * cols * vl)
            out = []
            for j, at in enumerate(ats):
                a = None if acc is None else acc[j]
                for kw in range(p.KW):
                    w = load_vec(b, gep(b, wk, kw * p.lanes_channels), vl)
                    x = load_vec(b, gep(b, gep(b, at, row), kw * p.dw * vl), vl)
                    a = b.fmul(w, x) if a is None else fma(b, w, x, a)
                out.append(a)
            return out

        def tile(c0: ir.Value, nc: int, px0: ir.Value, npx: int) -> None:
            """Output pixels px0 .. px0+npx of channels c0 .. c0+nc. Kernels of ``ROW_LOOP_TAPS`` taps or
            more loop over their rows (the same sums in the same order: unrolled, MobileNetV3-ish's 5x5
            layers were 5,400 instructions a kernel, the largest part of its cold compile's peak)."""
            ats = []
            for j in range(npx):
                q = b.add(px0, i64(j))
                oy = b.udiv(q, i64(p.OW))
                ox = b.sub(q, b.mul(oy, i64(p.OW)))
                ats.append(gep(b, plane, b.mul(b.add(b.mul(oy, i64(p.sh * cols)), b.mul(ox, i64(p.sw))), i64(vl))))
            if p.KH * p.KW >= ROW_LOOP_TAPS:  # from -0.0: fma(w, x, -0.0) is w * x to the bit, zeros' signs too
                acc = acc_loop(b, p.KH, [[neg_zero] * npx], lambda i, ph: [taps_of_row(c0, i, ats, ph[0])], "kh")[0]
            else:
                acc = None
                for kh in range(p.KH):
                    acc = taps_of_row(c0, kh, ats, acc)
            rows = transpose(b, acc + [zero] * (vl - npx))[:nc]
            out = Out(gep(b, yn, b.add(b.mul(c0, i64(P)), px0)), P, [i64(0)],
                      [lane_mask(vl, npx) if npx < vl else None], **epi)
            if bias:
                out.bias, out.bias_ptr = "row", gep(b, bias_p, c0)
            if rn is not None:
                out.residual = gep(b, rn, b.add(b.mul(c0, i64(P)), px0))
            epilogue(b, vl, [[r] for r in rows], out)

        def group(c0: ir.Value, nc: int) -> None:
            blocks(HW, vl, lambda q0, nq: fill(c0, nc, q0, nq), "fq")
            blocks(P, vl, lambda px0, npx: tile(c0, nc, px0, npx), "px")

        blocks(C, vl, group, "cg")
    b.ret_void()


def _zero_borders(b: ir.IRBuilder, p: ConvPlan, plane: ir.Value) -> None:
    """Zero the plane's padding: the top and bottom rows, then the left and right columns of each row."""
    vl, cols = p.vl, p.W + p.pl + p.pr
    if p.pt:
        memset0(b, plane, 4 * p.pt * cols * vl)
    if p.pb:
        memset0(b, gep(b, plane, (p.pt + p.H) * cols * vl), 4 * p.pb * cols * vl)
    if p.pl or p.pr:
        zero = vector(vec_type(vl), None)
        with for_range(b, p.H, name="zr") as r:
            row = gep(b, plane, b.mul(b.add(r, i64(p.pt)), i64(cols * vl)))
            for c in list(range(p.pl)) + list(range(p.pl + p.W, cols)):
                store_vec(b, zero, gep(b, row, c * vl))
