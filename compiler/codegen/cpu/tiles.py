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


def choose_tile(target: Target, rows: int, slots: int, max_nv: int = 8, min_mr: int = 1) -> tuple[int, int]:
    """(MR, NV): accumulator rows x vector columns minimising modelled cycles over the whole
    rows x slots problem, tails included (rows: output rows / channels, slots: vectors)."""
    return tile_cost(target, rows, slots, max_nv, min_mr)[1:]


def tile_cost(target: Target, rows: int, slots: int, max_nv: int = 8, min_mr: int = 1) -> tuple[float, int, int]:
    """(modelled cycles per k step of the whole problem, MR, NV) of the best tile with at least
    ``min_mr`` rows (where registers allow: one vector column always may)."""
    if rows <= 0 or slots <= 0:
        return 0.0, 1, 1
    regs, reserved = target.tuning.vector_registers, target.tuning.reserved_registers
    best: tuple[float, int, int, int] | None = None
    for nv in range(1, min(max_nv, slots) + 1):
        mr_max = max(1, min(rows, (regs - nv - reserved) // nv, 16 if regs == 16 else 28))
        for mr in range(min(min_mr, mr_max) if nv == 1 else min_mr, mr_max + 1):
            cost = grid_cost(rows, slots, mr, nv, per_cell=0.02)
            key = (cost, -mr * nv, mr, nv)
            if best is None or key < best:
                best = key
    assert best is not None
    return best[0], best[2], best[3]


def gemm_tile(target: Target, M: int, N: int) -> tuple[int, int]:
    """The register tile emit_gemm uses: (MR rows of C, NV vectors of VL columns)."""
    return choose_tile(target, M, math.ceil(N / vector_lanes(target)))


def pack_gemm_b(W: np.ndarray, target: Target, *, trans_b: bool = False, alpha: float = 1.0) -> np.ndarray:
    """B[K,N] (or [N,K] with trans_b) -> panels [ceil(N/VL), K, VL], zero-padded, times alpha."""
    B = np.asarray(W, dtype=np.float64)
    if trans_b:
        B = B.T
    K, N = B.shape
    vl = vector_lanes(target)
    npan = math.ceil(N / vl)
    out = np.zeros((K, npan * vl), dtype=np.float64)
    out[:, :N] = B * alpha
    return np.ascontiguousarray(out.reshape(K, npan, vl).transpose(1, 0, 2), dtype=np.float32)
