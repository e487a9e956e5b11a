"""Dilated 3x3 convs by Winograd: d x d undilated convs on the input's phase planes ("space to batch").

Output pixel (oh, ow) of a conv dilated d reads only input pixels of its phase (oh % d, ow % d), so
the atrous conv is the undilated conv of ``phases.phase_plane`` on each of the d*d planes
X[ph::d, pw::d]. Per image: the planes are de-interleaved into scratch (zero-filled past the image,
which is the conv's padding there), the ordinary Winograd kernel (``winograd.py``) runs them with
the bias and activation, and its outputs are interleaved back into Y. ``phases.winograd_images`` lays
the planes out: a batch of d*d images where each is large enough for F(4x4), else tiled into one
image with the planes' padding as zero rows and columns between them (small planes' tiles would
fill few vector lanes). A residual is de-interleaved like the input first (it may alias Y). Each
row moves VL outputs at a time: d vector loads, one shuffle per phase. Measured on Zen 4 (64 -> 64
channels on 32x32, the kernel alone, us, against direct): dilation 2 as four 16x16 planes 213-227
vs 699-764; 4 as one 35x35 image 363-397 vs 751-781 (a batch of 8x8 planes by F(2x2): 408-461);
6 as one 41x41 image 515 vs 715-735; x86-avx2 on the same host alike.
"""

from __future__ import annotations

from contextlib import nullcontext

from llvmlite import ir

from ....target import Target
from ...irhelpers import I1, I32, for_range, gep, i64, memset0, vector
from ..vecops import define_kernel, load_vec, store_vec, vec_type
from .phases import WinogradImages
from .layout import ConvPlan
from .winograd import emit_winograd


def emit_dilated_winograd(fn: ir.Function, p: ConvPlan, target: Target, *, bias: bool, residual: bool,
                          activation: str, act_alpha: float, act_beta: float) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel) for a Winograd plan with dilation > 1."""
    X, Up, bias_p, res_p, Y, scratch = fn.args
    d, vl, C, OC = p.dh, p.vl, p.C, p.OC
    im, g = p.winograd_images, p.winograd_geometry
    pt, pl, pb, pr = im.pads
    planes_in, planes_out = im.plane, (im.plane[0] + pt + pb - 2, im.plane[1] + pl + pr - 2)
    inner = define_kernel(fn.module, f"{fn.name}.phases", target)
    inner.linkage = "internal"
    emit_winograd(inner, target, im.count, C, im.H, im.W, OC, im.pads, bias=bias, residual=residual,
                  activation=activation, act_alpha=act_alpha, act_beta=act_beta, m=p.mr)
    xs_n, ys_n = p.phase_floats
    tails = not target.tuning.masked_stores
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    xs, ys, rest = scratch, gep(b, scratch, xs_n), gep(b, scratch, p.phase_copy_floats(residual))
    rs = gep(b, ys, ys_n) if residual else ir.Constant(ys.type, None)
    if p.H % d or p.W % d or im.count == 1:
        memset0(b, xs, 4 * xs_n)  # never written (rows past the image, the gaps between tiled planes): zero padding
    with for_range(b, p.N, name="n") as n:
        x_in = (C, (p.H, p.W), planes_in, (im.H, im.W))
        _split(b, vl, im, gep(b, X, b.mul(n, i64(C * p.H * p.W))), xs, *x_in, tails)
        y_out = (OC, (p.OH, p.OW), planes_out, (g.OH, g.OW))
        if residual:
            _split(b, vl, im, gep(b, res_p, b.mul(n, i64(OC * p.OH * p.OW))), rs, *y_out, tails)
        b.call(inner, [xs, Up, bias_p, rs, ys, rest])
        _merge(b, vl, im, ys, gep(b, Y, b.mul(n, i64(OC * p.OH * p.OW))), *y_out, tails)
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


def _each_row(b, vl, im: WinogradImages, chans, hw, plane_hw, image_hw, full, planes, chunk) -> None:
    """For every row of a [chans, H, W] image (``hw``) and its place among the phase planes (``plane_hw``
    each, in ``im.count`` images of ``image_hw``, at ``im.origin``): ``chunk(k, row, phase_row)`` for each
    chunk k of VL plane columns (d * VL image columns), where ``row`` points at the image row and
    ``phase_row(pw)`` at plane (ph, pw)'s row."""
    d, (H, W), (Hs, Ws), (Hi, Wi) = im.d, hw, plane_hw, image_hw
    with for_range(b, chans, name="pc") as c, for_range(b, Hs, name="pi") as i:
        for ph in range(d):
            r = b.add(b.mul(i, i64(d)), i64(ph))
            with b.if_then(b.icmp_signed("<", r, i64(H))) if (Hs - 1) * d + ph >= H else nullcontext():
                row = gep(b, full, b.add(b.mul(c, i64(H * W)), b.mul(r, i64(W))))
                for k in range(-(-Ws // vl)):
                    def phase_row(pw, k=k, ph=ph):
                        img, r0, c0 = im.origin(ph, pw)
                        at = b.add(b.mul(b.add(c, i64(img * chans)), i64(Hi * Wi)), b.mul(b.add(i, i64(r0)), i64(Wi)))
                        return gep(b, planes, b.add(at, i64(c0 + k * vl)))
                    chunk(k, row, phase_row)


def _split(b, vl, im, src, dst, chans, hw, plane_hw, image_hw, tails) -> None:
    """Plane (ph, pw)'s pixel (i, j) = src[c, i * d + ph, j * d + pw] for every pixel of src ([chans, H, W])."""
    d, (H, W), Ws = im.d, hw, plane_hw[1]

    def chunk(k, row, phase_row):
        ats = [(k * d + t) * vl for t in range(d)]
        wide = _concat(b, [load_vec(b, gep(b, row, at), vl, _mask(vl, W - at)) if at < W
                           else vector(vec_type(vl), None) for at in ats])
        for pw in range(d):
            phase = _pick(b, wide, [pw + d * q for q in range(vl)])
            store_vec(b, phase, phase_row(pw), _mask(vl, Ws - k * vl), tails)
    _each_row(b, vl, im, chans, hw, plane_hw, image_hw, src, dst, chunk)


def _merge(b, vl, im, src, dst, chans, hw, plane_hw, image_hw, tails) -> None:
    """dst[c, i * d + ph, j * d + pw] = plane (ph, pw)'s pixel (i, j) for every pixel of dst ([chans, OH, OW])."""
    d, OW, OWs = im.d, hw[1], plane_hw[1]

    def chunk(k, row, phase_row):
        wide = _concat(b, [load_vec(b, phase_row(pw), vl, _mask(vl, OWs - k * vl)) for pw in range(d)])
        for t in range(d):
            at = (k * d + t) * vl
            if at < OW:
                lanes = [(q % d) * vl + q // d for q in range(t * vl, (t + 1) * vl)]
                store_vec(b, _pick(b, wide, lanes), gep(b, row, at), _mask(vl, OW - at), tails)
    _each_row(b, vl, im, chans, hw, plane_hw, image_hw, dst, src, chunk)
