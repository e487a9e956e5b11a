"""The GEMM micro-kernel's register tile (a cost model in cycles per k step) and its packed B panels.

Pure Python and NumPy, shared by the GEMM, the conv methods and Winograd's point GEMMs, so the
emitters and the weight packers pick the same tile. ``pack_gemm_b(W[K,N], target, trans_b=False,
alpha=1.0) -> [ceil(N/VL), K, VL]``: one panel per vector of output columns, zero-padded; it does
not depend on M, so a Gemm/MatMul with a constant B packs it once. ``trans_b`` takes W as [N,K]
(ONNX Gemm transB); ``alpha`` is folded in.
"""

from __future__ import annotations

import math

import numpy as np

from ...target import Target

def vector_lanes(target: Target) -> int:
    return target.vector_floats


def step_cycles(mr: int, nv: int) -> float:
    """Cycles per k-step of an mr x nv tile: 2 FMA ports, 2 load ports, and (in practice) 12
    accumulators needed to hide the FMA latency."""
    return max(mr * nv / 2, (mr + nv) / 2, 6.0)


def grid_cost(rows: int, slots: int, mr: int, nv: int, per_cell: float = 0.0) -> float:
    """Modelled cycles per k step of a rows x slots problem cut into mr x nv tiles, tails included;
    ``per_cell`` charges each accumulator (its share of the epilogue)."""
    full_r, tail_r = divmod(rows, mr)
    full_s, tail_s = divmod(slots, nv)
    cost = 0.0
    for r, nr in ((mr, full_r), (tail_r, 1 if tail_r else 0)):
        for s, ns in ((nv, full_s), (tail_s, 1 if tail_s else 0)):
            if r and s:
                cost += nr * ns * (step_cycles(r, s) + per_cell * r * s)
    return cost


def choose_tile(target: Target, rows: int, slots: int, max_nv: int = 8, min_mr: int = 1,
                max_mr: int = 28) -> tuple[int, int]:
    """(MR, NV): accumulator rows x vector columns minimising modelled cycles over the whole
    rows x slots problem, tails included (rows: output rows / channels, slots: vectors)."""
    return tile_cost(target, rows, slots, max_nv, min_mr, max_mr)[1:]


def tile_cost(target: Target, rows: int, slots: int, max_nv: int = 8, min_mr: int = 1,
              max_mr: int = 28) -> tuple[float, int, int]:
    """(modelled cycles per k step of the whole problem, MR, NV) of the best tile with at least
    ``min_mr`` rows (where registers allow: one vector column always may) and at most ``max_mr``."""
    if rows <= 0 or slots <= 0:
        return 0.0, 1, 1
    regs, reserved = target.tuning.vector_registers, target.tuning.reserved_registers
    best: tuple[float, int, int, int] | None = None
    for nv in range(1, min(max_nv, slots) + 1):
        mr_max = max(1, min(rows, (regs - nv - reserved) // nv, 16 if regs == 16 else 28, max_mr))
        for mr in range(min(min_mr, mr_max) if nv == 1 else min_mr, mr_max + 1):
            cost = grid_cost(rows, slots, mr, nv, per_cell=0.02)
            key = (cost, -mr * nv, mr, nv)
            if best is None or key < best:
                best = key
    assert best is not None
    return best[0], best[2], best[3]


def gemm_tile(target: Target, M: int, N: int, wide: bool = False) -> tuple[int, int]:
    """The register tile emit_gemm uses: (MR rows of C, NV vectors of VL columns). On a ``wide`` B
    (:func:`pack_gemv_b`) a GEMV's row of C may take every register but one for A's broadcast."""
    regs = target.tuning.vector_registers - target.tuning.reserved_registers - 1
    return choose_tile(target, M, math.ceil(N / vector_lanes(target)), max_nv=regs if wide else 8)


def pack_gemm_b(W: np.ndarray, target: Target, *, trans_b: bool = False, alpha: float = 1.0) -> np.ndarray:
    """B[K,N] (or [N,K] with trans_b) -> panels [ceil(N/VL), K, VL], zero-padded, times alpha (a product
    rounded once, as :func:`_padded_b`'s). Written panel by panel: a padded copy of B and its transposed
    copy raised wide_mlp's cold peak by 8 MiB per 8 MiB layer, and a transposed B packed 9x slower."""
    B = np.asarray(W)
    if trans_b:
        B = B.T
    K, N = B.shape
    vl = vector_lanes(target)
    out = np.zeros((math.ceil(N / vl), K, vl), dtype=np.float32)
    for j in range(0, N, vl):
        cols = B[:, j:j + vl]
        out[j // vl, :, :cols.shape[1]] = cols if alpha == 1.0 else np.asarray(cols, dtype=np.float64) * alpha
    return out


def pack_gemv_b(W: np.ndarray, target: Target, *, trans_b: bool = False, alpha: float = 1.0) -> np.ndarray:
    """B[K,N] (or [N,K] with trans_b) for a GEMV (M = 1): panels [K, NV*VL] as wide as its tile
    (``gemm_tile(..., wide=True)``), the last one narrower, one after the other, flat; zero-padded to
    whole vectors, times alpha. Each B vector feeds one FMA, so the tile spans as many columns as the
    registers allow and reads its panel as one stream: vector panels of K=64 rows are 4 KiB apart, so
    16 of them fall in one L1 set (the LSTM's 1x64 by 64x256 steps on Zen 4: 1.35x slower than 8
    panels; one 16-vector panel 0.94x), and whole rows of a wide B put every k on another page."""
    padded = _padded_b(W, target, trans_b, alpha)
    width = gemm_tile(target, 1, padded.shape[1], wide=True)[1] * vector_lanes(target)
    panels = [padded[:, j:j + width].ravel() for j in range(0, padded.shape[1], width)]
    return np.concatenate(panels) if panels else padded.ravel()


def _padded_b(W: np.ndarray, target: Target, trans_b: bool, alpha: float) -> np.ndarray:
    """B[K, N] times alpha, zero-padded to whole vectors of columns, float32 (rounded once: a product
    in float64; without one, B itself, so no float64 copies of a large B are made: MobileNetV2's last
    1x1 conv's packing raised its cold compile's peak by 5 MiB)."""
    B = np.asarray(W)
    if trans_b:
        B = B.T
    K, N = B.shape
    vl = vector_lanes(target)
    out = np.zeros((K, math.ceil(N / vl) * vl), dtype=np.float32)
    out[:, :N] = B if alpha == 1.0 else np.asarray(B, dtype=np.float64) * alpha
    return out
