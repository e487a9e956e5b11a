"""Conv weights in the layout each method's emitter reads (pure NumPy, one packer per method).

Pure NumPy, so the coordinator's pre-flight lowering and the device produce the same bytes. Every
packer returns a C-contiguous float32 array; the caller places it 64-byte aligned. Layouts
(VL = ``target.vector_floats``, MR and NV from :func:`plan.conv_plan`):

* direct / im2col: ``[group, ceil(OCg/MR), C/g*KH*KW, MR]``, rows past OCg zero; K runs over
  (channel, kh, kw), the order the kernels walk.
* depthwise (and dwstride2, dwflat): ``[OC, KH*KW]``; dwlanes (channels in lanes): ``[KH*KW, OC padded
  to VL]``, zeros past OC.
* transposed (1x1 convs over few pixels, output channels along the vectors): per group, W_g^T
  packed as ``tiles.pack_gemm_b`` panels, ``[group, ceil(OCg/VL), C/g, VL]``.
* rows (3x3 over many channels, small outputs): per tile of nv panels of ``plan.column_tiles``,
  ``[C, KH*KW, nv, VL]``, the tiles one after another (a flat array).
* winograd (3x3 stride 1; dilated: of the phase planes): U = G g G^T per transform point,
  ``[(m+2)^2, ceil(OC/MR), C, MR]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ....target import Target
from ..tiles import pack_gemm_b
from .layout import ConvPlan
from .plan import column_tiles, conv_plan
from .winograd_geometry import WinogradGeometry, winograd_gemm_tile
from .winograd_math import MATS


def pack_winograd_weights(Wt: np.ndarray, target: Target, m: int, H: int, W: int, pads) -> np.ndarray:
    """W[OC, C, 3, 3] -> U = G g G^T per transform point, as GEMM row panels [A, ceil(OC/MR), C, MR].

    Computed in float64 a few panels at a time and rounded straight into the packed float32 array
    (no float64 copy of the whole layer: 512x512 channels would hold 50 MB of it)."""
    OC, C = Wt.shape[:2]
    A = (m + 2) ** 2
    mr, _ = winograd_gemm_tile(target, WinogradGeometry.for_tuning(target.vector_floats, C, H, W, OC, pads, m, target.tuning), OC)
    out = np.zeros((A, -(-OC // mr), C, mr), dtype=np.float32)  # [point, panel, input channel, MR rows]
    G2 = np.kron(MATS[m][1], MATS[m][1])
    step = mr * max(1, (1 << 18) // (mr * C * 9))  # ~2^18 weights per float64 product: a few MB at a time
    for o in range(0, OC, step):
        rows = min(step, OC - o)
        U = (G2 @ np.asarray(Wt[o:o + rows], dtype=np.float64).reshape(rows * C, 9).T).reshape(A, rows, C)
        b, full = o // mr, rows // mr  # o is a multiple of MR; only the last chunk may end in a part panel
        out[:, b:b + full] = U[:, :full * mr].reshape(A, full, mr, C).transpose(0, 1, 3, 2)
        if rows % mr:
            out[:, b + full, :, :rows % mr] = U[:, full * mr:].transpose(0, 2, 1)
    return out


def _winograd(w: np.ndarray, p: ConvPlan, target: Target) -> np.ndarray:
    im = p.winograd_images
    return pack_winograd_weights(w, target, p.mr, im.H, im.W, im.pads)


def _depthwise(w: np.ndarray, p: ConvPlan, target: Target) -> np.ndarray:
    return np.ascontiguousarray(w.reshape(p.OC, p.T))


def _dwlanes(w: np.ndarray, p: ConvPlan, target: Target) -> np.ndarray:
    out = np.zeros((p.T, p.lanes_channels), dtype=np.float32)
    out[:, : p.OC] = w.reshape(p.OC, p.T).T
    return out


def _rows(w: np.ndarray, p: ConvPlan, target: Target) -> np.ndarray:
    """Per column tile of nv panels [C, KH*KW, nv, VL]: one contiguous stream, each tile copied
    once from the weights straight into its place (output channels past OC stay zero)."""
    npan = math.ceil(p.OC / p.vl)
    w = w.reshape(p.OC, p.Cg, p.T)
    flat, at = np.zeros(npan * p.vl * p.Cg * p.T, dtype=np.float32), 0
    for first, count, nv in column_tiles(npan, p.nv):
        for s in range(first, first + count * nv, nv):
            n, lo = nv * p.vl * p.Cg * p.T, s * p.vl  # a tile's [Cg, T, nv, VL] is [Cg, T, its channels]
            rows = min(nv * p.vl, p.OC - lo)
            flat[at: at + n].reshape(p.Cg, p.T, nv * p.vl)[:, :, :rows] = w[lo: lo + rows].transpose(1, 2, 0)
            at += n
    return flat


def _transposed(w: np.ndarray, p: ConvPlan, target: Target) -> np.ndarray:
    """Per group, W_g^T [C/g, OC/g] packed as pack_gemm_b panels."""
    return np.ascontiguousarray(np.stack([pack_gemm_b(wg.reshape(p.OCg, p.Cg), target, trans_b=True)
                                          for wg in w.reshape(p.group, p.OCg, p.Cg)]))


def _row_panels(w: np.ndarray, p: ConvPlan, target: Target) -> np.ndarray:
    """MR-row panels of the weight matrix, per group (direct and im2col)."""
    nb = math.ceil(p.OCg / p.mr)
    out = np.zeros((p.group, nb * p.mr, p.K), dtype=np.float32)
    out[:, : p.OCg, :] = w.reshape(p.group, p.OCg, p.K)
    return np.ascontiguousarray(out.reshape(p.group, nb, p.mr, p.K).transpose(0, 1, 3, 2))


PACKERS: dict[str, Callable[[np.ndarray, ConvPlan, Target], np.ndarray]] = {
    "winograd": _winograd, "depthwise": _depthwise, "dwstride2": _depthwise, "dwflat": _depthwise, "dwlanes": _dwlanes,
    "rows": _rows, "transposed": _transposed,
    "direct": _row_panels, "im2col": _row_panels,
}


def pack_conv_weights(Wt: np.ndarray, target: Target, in_shape, strides=(1, 1), pads=(0, 0, 0, 0),
                      dilations=(1, 1), group: int = 1) -> np.ndarray:
    """W[OC, C/g, KH, KW] -> the layout emit_conv2d reads for this geometry (see module doc)."""
    OC, _, KH, KW = Wt.shape
    N, C, H, W = in_shape
    p = conv_plan(target, N, C, H, W, OC, KH, KW, strides, pads, dilations, group)
    w = Wt if p.method == "winograd" else np.asarray(Wt, dtype=np.float32)
    return PACKERS[p.method](w, p, target)
