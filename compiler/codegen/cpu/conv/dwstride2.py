"""Stride-2 3x3 depthwise convs read straight from the input (``plan.conv_plan``'s ``dwstride2``).

The ``depthwise`` method copies each channel into zero-bordered stride-phase planes first, so every
tap is one vector load; at stride 2 that copy (a load, a two-source shuffle and a misaligned store
per vector) took 60% of the layer (MobileNetV1's 32x64x64/2 alone, Zen 4: 25.2 us, 9.6 without
it). Here each input row is loaded once, two vectors per output vector, and split into its even
(x[2j]) and odd (x[2j+1]) lanes; the taps' inputs x[2j + kw - pl] are those two and one of them
moved a lane, the neighbouring vector's end shifted in: 2 loads and 3 shuffles per output vector
and kernel row (alone: 11.5 us at x86-avx512, 20.6 at x86-avx2 on the same host, against 22.3 and
29.5 with the copy). Loads that reach past a row's ends are masked (masked lanes read as zero, the
padding); kernel rows above or below the input are left out of the first and last output rows. An
output row is a few vectors, unrolled; bias, residual and activation are applied in registers as in
the other methods. Weights: ``[OC, 9]``, as ``depthwise``.
"""

from __future__ import annotations

from llvmlite import ir

from ...irhelpers import I32, for_range, gep, i64, vector
from ...mathfns import fma
from ..gemm import Out, epilogue
from ..vecops import broadcast, lane_mask, load_vec, vec_type
from .layout import ConvPlan


def _row_kernel_rows(p: ConvPlan, oh: int) -> tuple[int, ...]:
    """Kernel rows of output row ``oh`` that read an input row (not the padding)."""
    return tuple(kh for kh in range(3) if 0 <= 2 * oh + kh - p.pt < p.H)


def _span_mask(vl: int, start: int, W: int) -> ir.Value | None:
    """Mask of lanes start .. start+vl-1 that lie in [0, W); None when all do."""
    on = [0 <= start + i < W for i in range(vl)]
    return None if all(on) else vector(ir.VectorType(ir.IntType(1), vl), [int(x) for x in on])


def emit_depthwise_stride2(fn: ir.Function, p: ConvPlan, *, bias: bool, residual: bool, activation: str,
                           act_alpha: float, act_beta: float, scalar_tails: bool) -> None:
    """The body of ``fn`` (``emit_conv2d``'s signature) for a ``dwstride2`` plan."""
    X, Wp, bias_p, res_p, Y, _ = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, OH, OW, W = p.vl, p.OH, p.OW, p.W
    vpr = -(-OW // vl)
    even = vector(ir.VectorType(I32, vl), [2 * i for i in range(vl)])
    tail = lane_mask(vl, OW % vl) if OW % vl else None
    zero = vector(vec_type(vl), None)
    epi = dict(activation=activation, act_alpha=act_alpha, act_beta=act_beta, scalar_tails=scalar_tails)

    odd = vector(ir.VectorType(I32, vl), [2 * i + 1 for i in range(vl)])
    right = vector(ir.VectorType(I32, vl), [vl - 1] + list(range(vl, 2 * vl - 1)))  # (prev, cur): cur a lane right
    left = vector(ir.VectorType(I32, vl), list(range(1, vl + 1)))  # (cur, next): cur a lane left
    blocks = vpr + (2 * vl * vpr < W)  # a lookahead block where the last tap reaches past the last vector

    def taps_of_row(row: ir.Value) -> list[list[ir.Value]]:
        """Per output vector, the three taps' inputs x[2j + kw - pl] (kw = 0, 1, 2) of one input row, from
        the even and odd lanes of two loads (zero outside [0, W)): 2 loads and 3 shuffles a vector.
        Not an inbounds GEP: a masked load's address may lie past X."""
        ev, od = [], []
        for v in range(blocks):
            lo = load_vec(b, b.gep(row, [i64(2 * v * vl)]), vl, _span_mask(vl, 2 * v * vl, W))
            hi = load_vec(b, b.gep(row, [i64(2 * v * vl + vl)]), vl, _span_mask(vl, 2 * v * vl + vl, W))
            ev.append(b.shuffle_vector(lo, hi, even))  # x[2j]
            od.append(b.shuffle_vector(lo, hi, odd))  # x[2j + 1]
        ev.append(zero)
        out = []
        for v in range(vpr):
            shifted = {-1: b.shuffle_vector(od[v - 1] if v else zero, od[v], right),  # x[2j - 1]
                       0: ev[v], 1: od[v], 2: b.shuffle_vector(ev[v], ev[v + 1], left)}  # x[2j + 2]
            out.append([shifted[kw - p.pl] for kw in range(3)])
        return out

    with for_range(b, p.N * p.C, name="nc") as nc:
        c = b.urem(nc, i64(p.C)) if p.N > 1 else nc
        w_c = gep(b, Wp, b.mul(c, i64(9)))
        taps = [broadcast(b, b.load(gep(b, w_c, t), align=4), vl) for t in range(9)]
        x_c = gep(b, X, b.mul(nc, i64(p.H * W)))
        y_c = gep(b, Y, b.mul(nc, i64(OH * OW)))
        res_c = gep(b, res_p, b.mul(nc, i64(OH * OW))) if residual else None
        bias_c = gep(b, bias_p, c) if bias else None

        def out_row(oh: ir.Value, khs: tuple[int, ...]) -> None:
            ih0 = b.sub(b.mul(oh, i64(2)), i64(p.pt))  # input row of kernel row 0
            acc = [zero] * vpr
            for kh in khs:
                for v, xs in enumerate(taps_of_row(gep(b, x_c, b.mul(b.add(ih0, i64(kh)), i64(W))))):
                    for kw in range(3):
                        acc[v] = fma(b, taps[kh * 3 + kw], xs[kw], acc[v])
            yo = b.mul(oh, i64(OW))
            out = Out(y_c, 0, [b.add(yo, i64(v * vl)) for v in range(vpr)],
                      [tail if v == vpr - 1 else None for v in range(vpr)], residual=res_c, **epi)
            if bias_c is not None:
                out.bias, out.bias_ptr = "row", bias_c
            epilogue(b, vl, [acc], out)

        first = 1 if _row_kernel_rows(p, 0) != (0, 1, 2) else 0
        last = OH - 1 if OH - 1 >= first and _row_kernel_rows(p, OH - 1) != (0, 1, 2) else OH
        for oh in range(first):
            out_row(i64(oh), _row_kernel_rows(p, oh))
        if last > first:
            with for_range(b, last - first, name="oh") as t:
                out_row(b.add(t, i64(first)), (0, 1, 2))
        for oh in range(last, OH):
            out_row(i64(oh), _row_kernel_rows(p, oh))
    b.ret_void()
