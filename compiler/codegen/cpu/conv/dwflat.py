"""Depthwise stride-1 convs, each channel's plane read flat (``plan.conv_plan``'s ``dwflat``).

Where an output row is as long as an input row (stride 1, ``pl + pr == dw * (KW - 1)``), output pixel p
of a channel reads input pixel ``p + (kh*dh - pt) * W + (kw*dw - pl)`` for tap (kh, kw): one constant
offset per tap in the flattened plane. So VL consecutive output pixels, across row ends, are one
vector load per tap straight from the NCHW input, and whole vectors of the plane are computed (a 25x5
plane: 8 vectors, where rows in lanes fill 5 of 16 lanes and ``dwlanes`` transposes every channel in
and out of a channel-last copy). The lanes whose tap falls outside the image (past a row's end, above
or below the plane) are known at compile time (``flat_geometry.py``): each load is masked to the others
and reads zeros there, so padding costs nothing and nothing outside the plane is read. Vectors are summed
``nv`` at a time (``flat_geometry.DWFLAT_BLOCK``), each one's taps in order, then stored: the same sums in
the same order for any split of the channels over threads. The vectors whose lanes repeat row period by
row period run as a loop; the others are unrolled. Weights (``pack.py``): ``[OC, KH*KW]``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...irhelpers import I1, for_range, gep, i64, masked_load, vector
from ...mathfns import fma
from ..gemm import Out, epilogue
from ..vecops import broadcast, lane_mask, load_vec, vec_type
from .flat_geometry import FlatGeometry, flat_geometry
from .layout import ConvPlan


def emit_depthwise_flat(fn: ir.Function, p: ConvPlan, *, bias: bool, residual: bool, activation: str,
                        act_alpha: float, act_beta: float, scalar_tails: bool = False) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel; no scratch)."""
    X, Wp, bias_p, res_p, Y, _ = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, P, HW = p.vl, p.OH * p.OW, p.H * p.W
    g = flat_geometry(p.H, p.W, p.KH, p.KW, p.pads, (p.dh, p.dw), vl, p.nv)
    epi = dict(activation=activation, act_alpha=act_alpha, act_beta=act_beta, scalar_tails=scalar_tails)
    with for_range(b, p.N * p.C, name="nc") as nc:
        c = b.urem(nc, i64(p.C)) if p.N > 1 else nc
        xc, wc = gep(b, X, b.mul(nc, i64(HW))), gep(b, Wp, b.mul(c, i64(p.T)))
        ws = [broadcast(b, b.load(gep(b, wc, t), align=4), vl) if g.lanes[t].any() else None for t in range(p.T)]
        yc, rc = gep(b, Y, b.mul(nc, i64(P))), gep(b, res_p, b.mul(nc, i64(P))) if residual else None
        bc = gep(b, bias_p, c) if bias else None

        def vectors(vs: range, shift: ir.Value | None = None) -> None:
            """Output vectors ``vs`` (their lanes' pattern), ``shift`` vectors further on."""
            px = i64(0) if shift is None else b.mul(shift, i64(vl))
            for v0 in range(vs.start, vs.stop, p.nv):
                block = range(v0, min(vs.stop, v0 + p.nv))
                sums = [_sum(b, g, ws, gep(b, xc, b.add(px, i64(v * vl))), v) for v in block]
                out = Out(gep(b, yc, px), P, [i64(v * vl) for v in block],
                          [lane_mask(vl, P - v * vl) if P - v * vl < vl else None for v in block], **epi)
                if bc is not None:
                    out.bias, out.bias_ptr = "row", bc
                if rc is not None:
                    out.residual = gep(b, rc, px)
                epilogue(b, vl, [sums], out)

        loop_end = g.first + g.body * g.count
        vectors(range(0, g.first))
        if g.count:
            with for_range(b, g.count, name="fp") as k:
                vectors(range(g.first, g.first + g.body), b.mul(k, i64(g.body)))
        vectors(range(loop_end, g.vectors))
    b.ret_void()


def _sum(b: ir.IRBuilder, g: FlatGeometry, ws: list, at: ir.Value, v: int) -> ir.Value:
    """Output vector v's sum over its taps, in tap order (zero where no tap reads the image)."""
    acc = None
    for t, off in enumerate(g.offsets):
        on = g.lanes[t, v]
        if on.any():
            x = _tap_load(b, gep(b, at, off), on)
            acc = b.fmul(ws[t], x) if acc is None else fma(b, ws[t], x, acc)
    return acc if acc is not None else vector(vec_type(len(g.lanes[0, v])), None)


def _tap_load(b: ir.IRBuilder, at: ir.Value, on: np.ndarray) -> ir.Value:
    """The vector at ``at``, its lanes off in ``on`` zero (and not read)."""
    vl = len(on)
    if on.all():
        return load_vec(b, at, vl)
    mask = vector(ir.VectorType(I1, vl), [bool(k) for k in on])
    return masked_load(b, b.bitcast(at, vec_type(vl).as_pointer()), vec_type(vl), mask, 4, pad=vector(vec_type(vl), None))
