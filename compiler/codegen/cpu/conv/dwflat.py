"""Depthwise stride-1 convs on small planes, each channel's plane read flat (``plan.conv_plan``'s ``dwflat``).

Where an output row is as long as an input row (stride 1, ``pl + pr == dw * (KW - 1)``), output pixel p
of a channel reads input pixel ``p + (kh*dh - pt) * W + (kw*dw - pl)`` for tap (kh, kw): one constant
offset per tap in the flattened plane. So VL consecutive output pixels, across row ends, are one
vector load per tap straight from the NCHW input, and whole vectors of the plane are computed (a 25x5
plane: 8 vectors, where rows in lanes fill 5 of 16 lanes and ``dwlanes`` transposes every channel in
and out of a channel-last copy). The lanes whose tap falls outside the image (past a row's end, above
or below the plane) are known at compile time: each load is masked to the others and reads zeros
there, so padding costs nothing and nothing outside the plane is read. A plane of up to
``Tuning.dwflat_max_vectors`` vectors is unrolled per channel, ``nv`` vectors at a time (``plan.DWFLAT_BLOCK``),
each one's taps in order: the same sums in the same order for any split of the channels over threads.
Weights (``pack.py``): ``[OC, KH*KW]``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...irhelpers import I1, for_range, gep, i64, masked_load, vector
from ...mathfns import fma
from ..gemm import Out, epilogue
from ..vecops import broadcast, lane_mask, load_vec, vec_type
from .plan import ConvPlan


def tap_lanes(p: ConvPlan) -> np.ndarray:
    """[tap, output vector, lane]: whether that lane's input pixel lies inside the image (and the lane inside
    the plane)."""
    P, vl = p.OH * p.OW, p.vl
    q = np.arange(-(-P // vl) * vl)
    r, c = q // p.OW, q % p.OW
    taps = []
    for kh in range(p.KH):
        for kw in range(p.KW):
            sr, sc = r + kh * p.dh - p.pt, c + kw * p.dw - p.pl
            taps.append((q < P) & (sr >= 0) & (sr < p.H) & (sc >= 0) & (sc < p.W))
    return np.stack(taps).reshape(p.T, -1, vl)


def emit_depthwise_flat(fn: ir.Function, p: ConvPlan, *, bias: bool, residual: bool, activation: str,
                        act_alpha: float, act_beta: float, scalar_tails: bool = False) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel; no scratch)."""
    X, Wp, bias_p, res_p, Y, _ = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, P, HW = p.vl, p.OH * p.OW, p.H * p.W
    lanes = tap_lanes(p)
    nvec = lanes.shape[1]
    zero = vector(vec_type(vl), None)
    offsets = [(kh * p.dh - p.pt) * p.W + kw * p.dw - p.pl for kh in range(p.KH) for kw in range(p.KW)]
    epi = dict(activation=activation, act_alpha=act_alpha, act_beta=act_beta, scalar_tails=scalar_tails)
    with for_range(b, p.N * p.C, name="nc") as nc:
        c = b.urem(nc, i64(p.C)) if p.N > 1 else nc
        xc, wc = gep(b, X, b.mul(nc, i64(HW))), gep(b, Wp, b.mul(c, i64(p.T)))
        acc: list[ir.Value | None] = [None] * nvec
        ws = [broadcast(b, b.load(gep(b, wc, t), align=4), vl) if lanes[t].any() else None for t in range(p.T)]
        for v0 in range(0, nvec, p.nv):
            for t, off in enumerate(offsets):
                for v in range(v0, min(nvec, v0 + p.nv)):
                    if lanes[t, v].any():
                        x = _tap_load(b, gep(b, xc, v * vl + off), lanes[t, v], zero)
                        acc[v] = b.fmul(ws[t], x) if acc[v] is None else fma(b, ws[t], x, acc[v])
        yc = gep(b, Y, b.mul(nc, i64(P)))
        out = Out(yc, P, [i64(v * vl) for v in range(nvec)],
                  [lane_mask(vl, P - v * vl) if P - v * vl < vl else None for v in range(nvec)], **epi)
        if bias:
            out.bias, out.bias_ptr = "row", gep(b, bias_p, c)
        if residual:
            out.residual = gep(b, res_p, b.mul(nc, i64(P)))
        epilogue(b, vl, [[a if a is not None else zero for a in acc]], out)
    b.ret_void()


def _tap_load(b: ir.IRBuilder, at: ir.Value, on: np.ndarray, zero: ir.Value) -> ir.Value:
    """The vector at ``at``, its lanes off in ``on`` zero (and not read)."""
    vl = len(on)
    if on.all():
        return load_vec(b, at, vl)
    mask = vector(ir.VectorType(I1, vl), [bool(k) for k in on])
    return masked_load(b, b.bitcast(at, vec_type(vl).as_pointer()), vec_type(vl), mask, 4, pad=zero)
