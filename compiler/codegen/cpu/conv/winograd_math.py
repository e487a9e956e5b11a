"""Winograd transform matrices and their vector evaluation, for ``winograd.py`` (pure ``llvmlite.ir``).

The 1-D transforms share sums and differences: column pairs whose coefficients agree up to sign in
every row become x_k + x_l and x_k - x_l (A^T of F4: 14 -> 10 operations), and row pairs that differ
only in the sign of some terms become P + Q and P - Q (B^T of F4: 16 -> 12).

:func:`unzip_lanes` turns m vectors of consecutive pixels (VL/m tiles of m) into m tile vectors
(vector d: pixel d of each tile, lane = tile, in order) and :func:`zip_lanes` back; the ``_groups``
pair does the same within 128-bit groups only (unpacks and shufps: the in-order version cost the
F4 input transform a third more time on znver3), leaving the tiles in a fixed scrambled lane order.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from llvmlite import ir

from ...irhelpers import I32, vector
from ...mathfns import fma
from ..vecops import vec_type


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


def _lincomb(b, vl, coefs, vecs):
    """sum_k coefs[k] * vecs[k] over the nonzero coefficients (+-1 as adds and subtracts)."""
    acc = None
    for c, v in zip(coefs, vecs):
        c = float(c)
        if c == 0.0:
            continue
        if acc is None:
            acc = v if c == 1.0 else b.fmul(v, vector(vec_type(vl), [c] * vl))
        elif c in (1.0, -1.0):
            acc = b.fadd(acc, v) if c == 1.0 else b.fsub(acc, v)
        else:
            acc = fma(b, vector(vec_type(vl), [c] * vl), v, acc)
    return acc if acc is not None else vector(vec_type(vl), None)


@cache
def _plan_1d(mat: tuple) -> tuple:
    """(column pairs, rewritten coefficient rows, row pairs) of :func:`transform_1d` for ``mat``."""
    M = np.array(mat, dtype=float)
    cols = []
    for k in range(M.shape[1]):
        for k2 in range(k + 1, M.shape[1]):
            if {k, k2} & {c for p in cols for c in p} or not M[:, k].any():
                continue
            if np.array_equal(np.abs(M[:, k]), np.abs(M[:, k2])):
                cols.append((k, k2))
                M[:, k], M[:, k2] = (M[:, k] + M[:, k2]) / 2, (M[:, k] - M[:, k2]) / 2
    rows, paired = [], set()
    for i in range(len(M)):
        for j in range(i + 1, len(M)):
            nz = M[i] != 0
            same, flip = nz & (M[i] == M[j]), nz & (M[i] == -M[j])
            if {i, j} & paired or not (same.any() and flip.any()):
                continue
            if np.array_equal(nz, M[j] != 0) and np.array_equal(nz, same | flip):
                rows.append((i, j, tuple(M[i] * same), tuple(M[i] * flip)))
                paired |= {i, j}
    return tuple(cols), tuple(tuple(r) for r in M), tuple(rows)


def transform_1d(b, vl, mat, xs):
    """[row . xs for row in mat], sharing the sums and differences described in the module doc."""
    cols, M, rows = _plan_1d(tuple(tuple(float(c) for c in r) for r in mat))
    xs = list(xs)
    for k, k2 in cols:
        xs[k], xs[k2] = b.fadd(xs[k], xs[k2]), b.fsub(xs[k], xs[k2])
    out: list = [None] * len(M)
    for i, j, same, flip in rows:
        p, q = _lincomb(b, vl, same, xs), _lincomb(b, vl, flip, xs)
        out[i], out[j] = b.fadd(p, q), b.fsub(p, q)
    return [o if o is not None else _lincomb(b, vl, M[i], xs) for i, o in enumerate(out)]


def sandwich(b, vl, L, R, x):
    """L @ x @ R^T on a 2-D list of vectors."""
    cols = [transform_1d(b, vl, L, [row[j] for row in x]) for j in range(len(x[0]))]
    return [transform_1d(b, vl, R, [col[i] for col in cols]) for i in range(len(L))]


def zip_lanes(b, vs):
    """k vectors (k a power of two) -> k vectors of their lanes interleaved: lane l of vs[d] lands at
    flat position k*l + d. log2(k) rounds of pairwise perfect shuffles."""
    vl, h = vs[0].type.count, len(vs) // 2
    lo = vector(ir.VectorType(I32, vl), [x for i in range(vl // 2) for x in (i, vl + i)])
    hi = vector(ir.VectorType(I32, vl), [x for i in range(vl // 2, vl) for x in (i, vl + i)])
    for _ in range(len(vs).bit_length() - 1):
        vs = [x for i in range(h) for x in (b.shuffle_vector(vs[i], vs[i + h], lo),
                                            b.shuffle_vector(vs[i], vs[i + h], hi))]
    return vs


def unzip_lanes(b, vs):
    """Inverse of :func:`zip_lanes`: k consecutive vectors -> k vectors, vector d holding flat[k*l + d]."""
    vl, h = vs[0].type.count, len(vs) // 2
    ev = vector(ir.VectorType(I32, vl), list(range(0, 2 * vl, 2)))
    od = vector(ir.VectorType(I32, vl), list(range(1, 2 * vl, 2)))
    for _ in range(len(vs).bit_length() - 1):
        out = [None] * len(vs)
        for i in range(h):
            out[i] = b.shuffle_vector(vs[2 * i], vs[2 * i + 1], ev)
            out[i + h] = b.shuffle_vector(vs[2 * i], vs[2 * i + 1], od)
        vs = out
    return vs


def _group_mask(vl, pattern):
    """A shuffle mask repeating ``pattern`` (4 entries; k < 4: first operand, 4 + k: second) per
    128-bit group of lanes."""
    return vector(ir.VectorType(I32, vl), [4 * g + (k if k < 4 else vl + k - 4)
                                                 for g in range(vl // 4) for k in pattern])


def _group_net(b, vs, m):
    """In-group networks for m = 4 (a 4 x 4 transpose per group: its own inverse) and m = 2."""
    vl = vs[0].type.count
    if m == 2:
        return [b.shuffle_vector(vs[0], vs[1], _group_mask(vl, p)) for p in ((0, 2, 4, 6), (1, 3, 5, 7))]
    lo, hi = _group_mask(vl, (0, 4, 1, 5)), _group_mask(vl, (2, 6, 3, 7))
    t = [b.shuffle_vector(vs[i], vs[i + 1], mk) for i in (0, 2) for mk in (lo, hi)]
    dlo, dhi = _group_mask(vl, (0, 1, 4, 5)), _group_mask(vl, (2, 3, 6, 7))
    return [b.shuffle_vector(t[i], t[i + 2], mk) for i in (0, 1) for mk in (dlo, dhi)]


def unzip_groups(b, vs):
    """m = len(vs) vectors of consecutive floats (VL/m tiles of m each, a whole number per 128-bit
    group) -> m vectors, vector d holding element d of every tile, tiles in the group network's order."""
    return _group_net(b, vs, len(vs))


def zip_groups(b, vs):
    """Inverse of :func:`unzip_groups`."""
    if len(vs) == 4:
        return _group_net(b, vs, 4)
    vl = vs[0].type.count
    return [b.shuffle_vector(vs[0], vs[1], _group_mask(vl, p)) for p in ((0, 4, 1, 5), (2, 6, 3, 7))]
