"""Depthwise convs on narrow planes with channels in the vector lanes (``plan.conv_plan``'s ``dwlanes``).

The ``depthwise`` method puts an output row in the lanes, so a 5-wide plane (the keyword-spotting
DS-CNN's 25x5 layers) fills 5 of 8 lanes. Here each image is copied once into a zero-bordered
channel-last plane (``[row][col][channel]``, channels padded to whole vectors), so every tap of
an output pixel is one full vector load per channel group and no lane computes padding of a row.
A tile is MR consecutive output pixels x NV channel groups; its sums go back to the NCHW planes
through the transposed epilogue of ``gemm.py`` (bias per lane, residual and activation per output).
Weights (``pack.py``): ``[KH*KW, channels padded]``.
"""

from __future__ import annotations

from llvmlite import ir

from ...irhelpers import for_range, gep, i64, loop_nest, memset0
from ...mathfns import fma
from ..gemm import Out, epilogue
from ..vecops import load_vec
from .plan import ConvPlan


def emit_depthwise_lanes(fn: ir.Function, p: ConvPlan, *, bias: bool, residual: bool, activation: str,
                         act_alpha: float, act_beta: float, scalar_tails: bool = False) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel)."""
    X, Wp, bias_p, res_p, Y, plane = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, C, cp, cols = p.vl, p.C, p.lanes_channels, p.W + p.pl + p.pr
    P, HW = p.OH * p.OW, p.H * p.W
    memset0(b, plane, 4 * p.lanes_plane_floats)  # borders stay zero: every image rewrites the interior only
    taps = [(kh * p.dh * cols + kw * p.dw) * cp for kh in range(p.KH) for kw in range(p.KW)]
    epi = dict(activation=activation, act_alpha=act_alpha, act_beta=act_beta, scalar_tails=scalar_tails)
    with for_range(b, p.N, name="n") as n:
        xn = gep(b, X, b.mul(n, i64(C * HW)))
        with loop_nest(b, (p.H, p.W, C), name="fill") as (iy, ix, ch):
            src = b.add(b.mul(ch, i64(HW)), b.add(b.mul(iy, i64(p.W)), ix))
            dst = b.add(b.mul(b.add(b.mul(b.add(iy, i64(p.pt)), i64(cols)), b.add(ix, i64(p.pl))), i64(cp)), ch)
            b.store(b.load(gep(b, xn, src), align=4), gep(b, plane, dst), align=4)
        yn = gep(b, Y, b.mul(n, i64(C * P)))
        rn = gep(b, res_p, b.mul(n, i64(C * P))) if residual else None

        def tile(px0: ir.Value, mr: int, g0: ir.Value, lanes: list[int]) -> None:
            """Pixels px0 .. px0+mr x the channel groups from g0 (``lanes[v]`` valid channels each)."""
            bases = []
            for j in range(mr):
                q = b.add(px0, i64(j))
                oy = b.udiv(q, i64(p.OW))
                ox = b.sub(q, b.mul(oy, i64(p.OW)))
                bases.append(b.mul(b.add(b.mul(oy, i64(p.sh * cols)), b.mul(ox, i64(p.sw))), i64(cp)))
            ch0 = [b.add(b.mul(g0, i64(vl)), i64(v * vl)) for v in range(len(lanes))]
            acc = [[None] * len(lanes) for _ in range(mr)]
            for t, off in enumerate(taps):
                ws = [load_vec(b, gep(b, Wp, b.add(c, i64(t * cp))), vl) for c in ch0]
                for j in range(mr):
                    for v, c in enumerate(ch0):
                        x = load_vec(b, gep(b, plane, b.add(bases[j], b.add(c, i64(off)))), vl)
                        acc[j][v] = b.fmul(ws[v], x) if acc[j][v] is None else fma(b, ws[v], x, acc[j][v])
            out = Out(gep(b, yn, px0), 1, ch0, [None] * len(lanes), **epi, lane_stride=P, lanes=lanes)
            if bias:
                out.bias, out.bias_ptr = "col", bias_p
            if rn is not None:
                out.residual = gep(b, rn, px0)
            epilogue(b, vl, acc, out)

        def pixels(g0: ir.Value, lanes: list[int]) -> None:
            full, rest = divmod(P, p.mr)
            with for_range(b, full, name="px") as t:
                tile(b.mul(t, i64(p.mr)), p.mr, g0, lanes)
            if rest:
                tile(i64(full * p.mr), rest, g0, lanes)

        groups, part = divmod(C, vl)
        blocks, extra = divmod(groups, p.nv)
        if blocks:
            with for_range(b, blocks, name="gb") as gb:
                pixels(b.mul(gb, i64(p.nv)), [vl] * p.nv)
        if extra or part:
            pixels(i64(blocks * p.nv), [vl] * extra + ([part] if part else []))
    b.ret_void()

