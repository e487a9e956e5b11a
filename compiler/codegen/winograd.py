"""Winograd F(m x m, 3x3), m = 2 or 4 (Lavin & Gray 2016), for 3x3 stride-1 dilation-1 group-1 convs.

Pure ``llvmlite.ir`` plus the NumPy weight transform. Same signature and epilogue as
``conv.emit_conv2d``, which dispatches here when ``packing.conv_plan`` picks ``"winograd"`` (its
``mr`` field is then m). Per image, with tiles of m x m outputs (TH x TW, T in all), a = m + 2 and
A = a*a transform points (Cp / OCp: C / OC rounded up to VL):

1. ``Xt`` [Hp, Wp, Cp]: the zero-padded input, channels last (8x8 shuffle transposes), so the
   transforms are vector code over channels.
2. ``V[xi]`` [T, Cp] = (B^T d B)[xi] per tile and channel.
3. ``M[xi]`` [T, OCp] = V[xi] @ U[xi]: A GEMMs through ``gemm.emit_gemm`` (U = G g G^T in float64 at
   pack time, packed per point by ``pack_gemm_b``'s layout).
4. ``Yt`` [OH, OW, OCp] = A^T M A; transposed back to NCHW with bias, residual and activation.

Steps 1-4 are one noinline helper shared by same-shape layers of a module (one copy of LLVM work);
each kernel adds only its epilogue. F4 interpolates at 0, +-1, +-1/2 (smaller fp32 error than +-2).

Weights: ``pack_winograd_weights(W[OC, C, 3, 3], target, m) -> [A, ceil(OCp/VL), Cp, VL]``.
Measured on znver3 (AVX2, 1 thread, bias+ReLU) vs the direct kernel: 64x32x32 F4 2.6x (F2 1.6x),
128x16x16 F4 2.9x (F2 1.9x), 256x8x8 F2 2.0x (F4 1.4x), 512x4x4 F2 0.8-1.0x (not used: 4 tiles,
16/9x the weight bytes). fp32 error: F2 below the direct kernel's; F4 up to ~2e-5 of the output range.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ..target import Target
from .activations import apply_activation
from .gemm import emit_gemm
from .irhelpers import F32, I32, for_range, i64
from .mathfns import fma
from .vecops import (
    broadcast,
    call_intrinsic,
    define_kernel,
    gep,
    lane_mask,
    load_vec,
    scalar_tail_stores,
    store_vec,
    vec_type,
)

I8P = ir.IntType(8).as_pointer()
def _cook_toom(points, m: int, r: int = 3):
    """(B^T, G, A^T) of F(m, r) interpolating at ``points`` and infinity (Lavin & Gray's construction;
    B^T solved from A^T diag(G e_k) B^T = the correlation with e_k, exact dyadic for these points)."""
    n = m + r - 1
    AT, G = np.zeros((m, n)), np.zeros((n, r))
    for j, a in enumerate(points):
        AT[:, j] = [a ** i for i in range(m)]
        G[j] = [a ** k / np.prod([a - c for c in points if c != a]) for k in range(r)]
    AT[m - 1, n - 1] = G[n - 1, r - 1] = 1.0
    lhs = np.vstack([np.kron(AT * G[:, k], np.eye(n)) for k in range(r)])
    rhs = np.concatenate([np.eye(m, n, k).ravel() for k in range(r)])
    BT = np.round(np.linalg.lstsq(lhs, rhs, rcond=None)[0].reshape(n, n) * 4096) / 4096
    return BT, G, AT


# m (output tile) -> (B^T, G, A^T) of F(m x m, 3 x 3); F4 at 0, +-1, +-1/2: smaller fp32 error than +-2
MATS = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
        np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)),
    4: _cook_toom([0.0, 1.0, -1.0, 0.5, -0.5], 4),
}


def _geom(vl: int, C: int, H: int, W: int, OC: int, pads, m: int) -> dict:
    pt, pl, pb, pr = pads
    OH, OW = H + pt + pb - 2, W + pl + pr - 2
    TH, TW = -(-OH // m), -(-OW // m)
    Cp, OCp = -(-C // vl) * vl, -(-OC // vl) * vl
    Hp, Wp = m * TH + 2, m * TW + 2
    T, A = TH * TW, (m + 2) ** 2
    xt = -(-Hp * Wp * Cp // 16) * 16
    vs, ms = T * Cp + 16, T * OCp + 16  # per-point strides: +64 B, so a tile's A points don't share L1 sets
    v = A * vs
    mm = A * ms
    yt = OH * OW * OCp + vl
    return {"OH": OH, "OW": OW, "TH": TH, "TW": TW, "T": T, "Cp": Cp, "OCp": OCp, "Hp": Hp, "Wp": Wp, "v_off": xt,
            "m_off": xt + v, "y_off": xt + v + mm, "floats": xt + v + mm + yt, "m": m, "A": A,
            "vs": vs, "ms": ms}


def winograd_scratch_bytes(target: Target, C: int, H: int, W: int, OC: int, pads, m: int) -> int:
    return 4 * _geom(target.vector_floats, C, H, W, OC, pads, m)["floats"]


def pack_winograd_weights(Wt: np.ndarray, target: Target, m: int) -> np.ndarray:
    """W[OC, C, 3, 3] -> U per transform point as pack_gemm_b panels [(m+2)^2, ceil(OCp/VL), Cp, VL]."""
    OC, C = Wt.shape[:2]
    vl, G, A = target.vector_floats, MATS[m][1], (m + 2) ** 2
    Cp, OCp = -(-C // vl) * vl, -(-OC // vl) * vl
    U = np.einsum("ak,ockl,bl->abco", G, np.asarray(Wt, dtype=np.float64), G).reshape(A, C, OC)  # G g G^T
    Upad = np.zeros((A, Cp, OCp))
    Upad[:, :C, :OC] = U
    return np.ascontiguousarray(Upad.reshape(A, Cp, OCp // vl, vl).transpose(0, 2, 1, 3), dtype=np.float32)


def _lincomb(b, vl, coefs, vecs):
    """sum_k coefs[k] * vecs[k] over the nonzero coefficients (+-1 as adds and subtracts)."""
    acc = None
    for c, v in zip(coefs, vecs):
        c = float(c)
        if c == 0.0:
            continue
        if acc is None:
            acc = v if c == 1.0 else b.fmul(v, ir.Constant(vec_type(vl), [c] * vl))
        elif c in (1.0, -1.0):
            acc = b.fadd(acc, v) if c == 1.0 else b.fsub(acc, v)
        else:
            acc = fma(b, ir.Constant(vec_type(vl), [c] * vl), v, acc)
    return acc if acc is not None else ir.Constant(vec_type(vl), None)


def _sandwich(b, vl, L, R, x):
    """L @ x @ R^T on a 2-D list of vectors."""
    t = [[_lincomb(b, vl, L[i], [x[k][j] for k in range(len(x))]) for j in range(len(x[0]))] for i in range(len(L))]
    return [[_lincomb(b, vl, R[j], t[i]) for j in range(len(R))] for i in range(len(L))]


def emit_winograd(fn: ir.Function, target: Target, N: int, C: int, H: int, W: int, OC: int, pads, *,
                  bias: bool, residual: bool, activation: str, act_alpha: float, act_beta: float, m: int = 2) -> None:
    """Emit the body of ``fn`` (an ``emit_conv2d``-signature kernel, no blocks yet)."""
    vl = target.vector_floats
    g = _geom(vl, C, H, W, OC, pads, m)
    OCp, OH, OW = g["OCp"], g["OH"], g["OW"]
    X, Up, bias_p, res_p, Y, scratch = fn.args
    key = f"{C}x{H}x{W}_{OC}_p{'_'.join(map(str, pads))}_{target.vector_bits}_f{m}"  # shared by same-shape layers
    stages = _shared(fn.module, f"winograd_stages_{key}", target,
                     lambda b, f: _stages(b, f, target, g, C, H, W, pads))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    null = ir.Constant(F32.as_pointer(), None)
    P = OH * OW
    with for_range(b, N, name="n") as n:
        xn = gep(b, X, b.mul(n, i64(C * H * W)))
        yn = gep(b, Y, b.mul(n, i64(OC * P)))
        rn = gep(b, res_p, b.mul(n, i64(OC * P))) if residual else None
        b.call(stages, [xn, Up, null, null, null, scratch])
        Yt = gep(b, scratch, g["y_off"])
        with for_range(b, OH, name="eh") as oh:  # back to NCHW, with the epilogue
            yrow = gep(b, Yt, b.mul(oh, i64(OW * OCp)))
            orow = b.mul(oh, i64(OW))

            def block_out(w0, c0, nw, nc):
                vs = _transpose(b, vl, gep(b, yrow, b.add(b.mul(w0, i64(OCp)), c0)), OCp, nw, nc)
                mask = lane_mask(vl, nw) if nw < vl else None
                for j in range(nc):
                    oc = b.add(c0, i64(j))
                    off = b.add(b.mul(oc, i64(P)), b.add(orow, w0))
                    y = vs[j]
                    if bias:
                        y = b.fadd(y, broadcast(b, b.load(gep(b, bias_p, oc), align=4), vl))
                    if residual:
                        y = b.fadd(y, load_vec(b, gep(b, rn, off), vl, mask))
                    if activation != "none":
                        y = apply_activation(b, y, activation, act_alpha, act_beta)
                    store_vec(b, y, gep(b, yn, off), mask, scalar_tails=scalar_tail_stores(target))
            _blocks(b, vl, OW, OC, block_out)
    b.ret_void()


def _shared(module, name, target, body):
    """A noinline ``define_kernel``-signature helper, defined once per module."""
    fn = module.globals.get(name)
    if fn is None:
        fn = define_kernel(module, name, target)
        fn.linkage = "internal"
        fn.attributes.add("noinline")  # else inlined, and loops unrolled around it
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        body(b, fn)
        b.ret_void()
    return fn


def _stages(b, fn, target, g, C, H, W, pads) -> None:
    """X (one image) -> Yt [OH, OW, OCp] in scratch: transpose, input transform, 16 GEMMs, output transform."""
    xn, Up, _, _, _, scratch = fn.args
    vl, pt, pl = target.vector_floats, pads[0], pads[1]
    T, Cp, OCp, Wp, TW, TH, OH, OW = (g[k] for k in ("T", "Cp", "OCp", "Wp", "TW", "TH", "OH", "OW"))
    Xt, V, M = scratch, gep(b, scratch, g["v_off"]), gep(b, scratch, g["m_off"])
    null = ir.Constant(F32.as_pointer(), None)
    gname = f"winograd_gemm_{T}x{OCp}x{Cp}_{target.vector_bits}"
    m, A = g["m"], g["A"]
    gemm = b.module.globals.get(gname)
    if gemm is None:
        gemm = emit_gemm(b.module, gname, target, T, OCp, Cp, a_layout="row", b_layout="packed")
        gemm.linkage = "internal"
        gemm.attributes.add("noinline")
    _memset0(b, Xt, g["Hp"] * Wp * Cp)
    with for_range(b, H, name="th") as h:  # transpose to channels last, into the padded frame
        drow = gep(b, Xt, b.mul(b.add(h, i64(pt)), i64(Wp * Cp)))
        srow = gep(b, xn, b.mul(h, i64(W)))

        def block_in(w0, c0, nw, nc):
            vs = _transpose(b, vl, gep(b, srow, b.add(b.mul(c0, i64(H * W)), w0)), H * W, nc, nw)
            dst = gep(b, drow, b.add(b.mul(b.add(w0, i64(pl)), i64(Cp)), c0))
            for j in range(nw):
                store_vec(b, vs[j], gep(b, dst, j * Cp))
        _blocks(b, vl, W, C, block_in)
    _input_transform(b, vl, g, Xt, V)
    with for_range(b, A, name="xi") as xi:
        b.call(gemm, [gep(b, V, b.mul(xi, i64(g["vs"]))), gep(b, Up, b.mul(xi, i64(Cp * OCp))), null, null,
                      gep(b, M, b.mul(xi, i64(g["ms"]))), null])
    Yt = gep(b, scratch, g["y_off"])
    fh, fw = OH // m, OW // m
    for (r0, r1, ny) in ((0, fh, m), (fh, TH, OH - m * fh)):
        for (c0, c1, nx) in ((0, fw, m), (fw, TW, OW - m * fw)):
            if r1 > r0 and c1 > c0 and ny and nx:
                with for_range(b, r1, start=r0, name="oi") as ti:
                    with for_range(b, c1, start=c0, name="oj") as tj:
                        _output_tile(b, vl, g, M, Yt, ti, tj, ny, nx)


def _input_transform(b, vl, g, Xt, V) -> None:
    Cp, Wp, TW, m = g["Cp"], g["Wp"], g["TW"], g["m"]
    a, BT = m + 2, MATS[m][0]
    with for_range(b, g["TH"], name="ii") as ti:
        with for_range(b, TW, name="ij") as tj:
            t = b.add(b.mul(ti, i64(TW)), tj)
            base = gep(b, Xt, b.mul(b.add(b.mul(ti, i64(m * Wp)), b.mul(tj, i64(m))), i64(Cp)))
            vt = gep(b, V, b.mul(t, i64(Cp)))
            with for_range(b, Cp // vl, name="ic") as cv:
                c0 = b.mul(cv, i64(vl))
                src = gep(b, base, c0)
                d = [[load_vec(b, gep(b, src, (r * Wp + c) * Cp), vl) for c in range(a)] for r in range(a)]
                out = _sandwich(b, vl, BT, BT, d)
                dst = gep(b, vt, c0)
                for i in range(a):
                    for j in range(a):
                        store_vec(b, out[i][j], gep(b, dst, (i * a + j) * g["vs"]))


def _output_tile(b, vl, g, M, Yt, ti, tj, ny, nx) -> None:
    """Output transform of one tile's ny x nx outputs, all channels, into Yt [OH, OW, OCp]."""
    OCp, OW, TW, m = g["OCp"], g["OW"], g["TW"], g["m"]
    a, AT = m + 2, MATS[m][2]
    t = b.add(b.mul(ti, i64(TW)), tj)
    mt = gep(b, M, b.mul(t, i64(OCp)))
    yt = gep(b, Yt, b.mul(b.add(b.mul(ti, i64(m * OW)), b.mul(tj, i64(m))), i64(OCp)))
    with for_range(b, OCp // vl, name="oc") as cv:
        oc0 = b.mul(cv, i64(vl))
        src = gep(b, mt, oc0)
        mv = [[load_vec(b, gep(b, src, (i * a + j) * g["ms"]), vl) for j in range(a)] for i in range(a)]
        ys = _sandwich(b, vl, AT[:ny], AT[:nx], mv)
        dst = gep(b, yt, oc0)
        for dy in range(ny):
            for dx in range(nx):
                store_vec(b, ys[dy][dx], gep(b, dst, (dy * OW + dx) * OCp))


def _transpose(b, vl, src, stride, rows, cols):
    """Vectors j < cols with lane r < rows = src[r*stride + j] (other lanes zero)."""
    mask = lane_mask(vl, cols) if cols < vl else None
    zero = ir.Constant(vec_type(vl), None)
    v = [load_vec(b, gep(b, src, r * stride), vl, mask) for r in range(rows)] + [zero] * (vl - rows)
    h = vl // 2
    lo = ir.Constant(ir.VectorType(I32, vl), [k for i in range(h) for k in (i, vl + i)])
    hi = ir.Constant(ir.VectorType(I32, vl), [k for i in range(h, vl) for k in (i, vl + i)])
    for _ in range(int(math.log2(vl))):  # perfect shuffles: log2(vl) of them transpose the block
        v = [x for i in range(h) for x in (b.shuffle_vector(v[i], v[i + h], lo), b.shuffle_vector(v[i], v[i + h], hi))]
    return v[:cols]


def _blocks(b, vl, ncols, nrows, body) -> None:
    """body(w0, c0, nw, nc) over vl x vl blocks of a ncols (w) x nrows (c) plane, tails last."""
    fw, fc = ncols // vl, nrows // vl
    for (w_lo, w_n, nw) in ((0, fw, vl), (fw * vl, 1 if ncols % vl else 0, ncols % vl)):
        for (c_lo, c_n, nc) in ((0, fc, vl), (fc * vl, 1 if nrows % vl else 0, nrows % vl)):
            if not (w_n and c_n):
                continue
            if w_n == 1 and c_n == 1:
                body(i64(w_lo), i64(c_lo), nw, nc)
                continue
            with for_range(b, w_n, name="bw") as wi:
                w0 = b.add(i64(w_lo), b.mul(wi, i64(vl)))
                with for_range(b, c_n, name="bc") as ci:
                    body(w0, b.add(i64(c_lo), b.mul(ci, i64(vl))), nw, nc)


def _memset0(b: ir.IRBuilder, dst: ir.Value, nfloats: int) -> None:
    args = [b.bitcast(dst, I8P), ir.Constant(ir.IntType(8), 0), i64(4 * nfloats), ir.Constant(ir.IntType(1), 0)]
    call_intrinsic(b, "llvm.memset.p0.i64", ir.VoidType(), args)
