"""Dilated 3x3 convs by Winograd: d x d undilated convs on the input's phase planes ("space to batch").

Output pixel (oh, ow) of a conv dilated d reads only input pixels of its phase (oh % d, ow % d), so
the atrous conv is the undilated conv of ``plan.phase_plane`` on each of the d*d planes
X[ph::d, pw::d] (DeepLab's ASPP branches at dilation 2 and 4 on 32x32: 16x16 and 8x8 planes). Per
image: the planes are de-interleaved into scratch (zero-filled past the image, which is the conv's
padding there), the ordinary Winograd kernel (``winograd.py``) runs them as a batch of d*d images
with the bias and activation, and its outputs are interleaved back into Y. A residual is
de-interleaved like the input first (it may alias Y). Each row moves VL outputs at a time: d vector
loads, one shuffle per phase. Measured on Zen 4 (x86-avx512, 64 -> 64 channels on 32x32, the
kernel alone): dilation 2 699 -> 213 us (F4), dilation 4 660 -> 408 us (F2) against the direct
kernel; at dilation 6 the 6x6 planes are below ``Tuning.winograd_min_pixels`` and stay direct.
"""

from __future__ import annotations

from contextlib import nullcontext

from llvmlite import ir

from ....target import Target
from ...irhelpers import I1, I32, for_range, gep, i64, memset0, vector
from ..vecops import define_kernel, load_vec, store_vec, vec_type
from .plan import ConvPlan
from .winograd import emit_winograd


def emit_dilated_winograd(fn: ir.Function, p: ConvPlan, target: Target, *, bias: bool, residual: bool,
                          activation: str, act_alpha: float, act_beta: float) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel) for a Winograd plan with dilation > 1."""
    X, Up, bias_p, res_p, Y, scratch = fn.args
    d, vl, C, OC = p.dh, p.vl, p.C, p.OC
    Hs, Ws, sub_pads = p.winograd_plane
    g = p.winograd_geometry
    inner = define_kernel(fn.module, f"{fn.name}.phases", target)
    inner.linkage = "internal"
    emit_winograd(inner, target, d * d, C, Hs, Ws, OC, sub_pads, bias=bias, residual=residual,
                  activation=activation, act_alpha=act_alpha, act_beta=act_beta, m=p.mr)
    xs_n, ys_n = p.phase_floats
    tails = not target.tuning.masked_stores
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    xs, ys, rest = scratch, gep(b, scratch, xs_n), gep(b, scratch, xs_n + 2 * ys_n)
    rs = gep(b, ys, ys_n) if residual else ir.Constant(ys.type, None)
    if p.H % d or p.W % d:
        memset0(b, xs, 4 * xs_n)  # rows past the image, never written: the conv's zero padding
    with for_range(b, p.N, name="n") as n:
        _split(b, vl, d, gep(b, X, b.mul(n, i64(C * p.H * p.W))), C, p.H, p.W, xs, Hs, Ws, tails)
        if residual:
            _split(b, vl, d, gep(b, res_p, b.mul(n, i64(OC * p.OH * p.OW))), OC, p.OH, p.OW, rs, g.OH, g.OW, tails)
        b.call(inner, [xs, Up, bias_p, rs, ys, rest])
        _merge(b, vl, d, ys, OC, g.OH, g.OW, gep(b, Y, b.mul(n, i64(OC * p.OH * p.OW))), p.OH, p.OW, tails)
    b.ret_void()


def _concat(b: ir.IRBuilder, vs: list[ir.Value]) -> ir.Value:
    """One vector of ``vs`` end to end (zero vectors appended up to a power of two)."""
    while len(vs) & (len(vs) - 1):
        vs = vs + [vector(vs[0].type, None)]
    while len(vs) > 1:
        n = vs[0].type.count
        vs = [b.shuffle_vector(vs[i], vs[i + 1], vector(ir.VectorType(I32, 2 * n), range(2 * n)))
              for i in range(0, len(vs), 2)]
    return vs[0]


def _pick(b: ir.IRBuilder, wide: ir.Value, lanes: list[int]) -> ir.Value:
    return b.shuffle_vector(wide, wide, vector(ir.VectorType(I32, len(lanes)), lanes))


def _mask(vl: int, n: int) -> ir.Constant | None:
    return None if n >= vl else vector(ir.VectorType(I1, vl), [k < n for k in range(vl)])


def _each_row(b, vl, d, chans, H, W, Hs, Ws, full, planes, chunk) -> None:
    """For every row of a [chans, H, W] image and its place in the [d * d, chans, Hs, Ws] phase planes:
    ``chunk(k, row, phase_row)`` for each chunk k of VL plane columns (d * VL image columns), where
    ``row`` points at the image row and ``phase_row(pw)`` at plane (ph, pw)'s row."""
    plane = chans * Hs * Ws
    with for_range(b, chans, name="pc") as c, for_range(b, Hs, name="pi") as i:
        for ph in range(d):
            r = b.add(b.mul(i, i64(d)), i64(ph))
            with b.if_then(b.icmp_signed("<", r, i64(H))) if (Hs - 1) * d + ph >= H else nullcontext():
                row = gep(b, full, b.add(b.mul(c, i64(H * W)), b.mul(r, i64(W))))
                at = b.add(b.mul(c, i64(Hs * Ws)), b.mul(i, i64(Ws)))
                for k in range(-(-Ws // vl)):
                    def phase_row(pw, k=k, ph=ph, at=at):
                        return gep(b, planes, b.add(at, i64((ph * d + pw) * plane + k * vl)))
                    chunk(k, row, phase_row)


def _split(b, vl, d, src, chans, H, W, dst, Hs, Ws, tails) -> None:
    """dst[ph * d + pw, c, i, j] = src[c, i * d + ph, j * d + pw] for every pixel of src ([chans, H, W])."""
    def chunk(k, row, phase_row):
        ats = [(k * d + t) * vl for t in range(d)]
        wide = _concat(b, [load_vec(b, gep(b, row, at), vl, _mask(vl, W - at)) if at < W
                           else vector(vec_type(vl), None) for at in ats])
        for pw in range(d):
            phase = _pick(b, wide, [pw + d * q for q in range(vl)])
            store_vec(b, phase, phase_row(pw), _mask(vl, Ws - k * vl), tails)
    _each_row(b, vl, d, chans, H, W, Hs, Ws, src, dst, chunk)


def _merge(b, vl, d, src, chans, OHs, OWs, dst, OH, OW, tails) -> None:
    """dst[c, i * d + ph, j * d + pw] = src[ph * d + pw, c, i, j] for every pixel of dst ([chans, OH, OW])."""
    def chunk(k, row, phase_row):
        wide = _concat(b, [load_vec(b, phase_row(pw), vl, _mask(vl, OWs - k * vl)) for pw in range(d)])
        for t in range(d):
            at = (k * d + t) * vl
            if at < OW:
                lanes = [(q % d) * vl + q // d for q in range(t * vl, (t + 1) * vl)]
                store_vec(b, _pick(b, wide, lanes), gep(b, row, at), _mask(vl, OW - at), tails)
    _each_row(b, vl, d, chans, OH, OW, OHs, OWs, dst, src, chunk)
