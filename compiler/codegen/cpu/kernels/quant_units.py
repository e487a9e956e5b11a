"""What the int8 GEMM kernels (``quant.py``'s QConv, ``quant_matmul.py``'s QMatMul) share: the tag of
weights packed for a dot product, the activations' byte encoding, the packed row or column sums,
the requantization multipliers and the epilogue that takes the zero point out with them and
requantizes.

A QConv's packed weights carry its multipliers ahead of them (``with_multipliers``), so its code does
not depend on its scales: layers that differ only in their scales, and the output-channel parts of
a split layer, share one function.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....ir.dtypes import DType
from ....ops.quant import multiplier
from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ..int_dot import Dot, choose_dot
from ..int_gemm import store_bytes
from ...irhelpers import gep
from .base import KernelContext, KernelKey

QUADS = "quads:"  # + the Dot kind the packing was made for
SUMS_BYTES_ALIGN = 64
MULTIPLIERS = "multipliers"  # KernelContext.tables: the float32 multiplier of each output row
SCALES = ("x_scale", "w_scale", "y_scale")  # what a QConv's multipliers are made of
TABLE_ALIGN = 64  # more than any path pads its rows to (whole vectors of int32 lanes)


def table_rows(m: int) -> int:
    """Entries of the multiplier table carried ahead of ``m`` rows of packed weights."""
    return -(-m // TABLE_ALIGN) * TABLE_ALIGN


def with_multipliers(key: KernelKey, packed: np.ndarray) -> np.ndarray:
    """The QConv's float32 multipliers, one per output row (a per-tensor scale repeated; padding rows
    repeat the first ones), as bytes ahead of ``packed``; 256-byte whole, so ``packed`` keeps its
    alignment."""
    a = dict(key.attrs)
    m = np.resize(multiplier(*(a[n] for n in SCALES)), table_rows(key.in_types[1].shape[0]))
    return np.concatenate([m.astype(np.float32).view(np.uint8), np.ascontiguousarray(packed).reshape(-1).view(np.uint8)])


def multipliers(ctx: KernelContext, names: tuple[str, str, str] = SCALES, pad: int = 0) -> tuple[ir.Value | None, float]:
    """The requantization multipliers as (a float32 table, one entry per row, or None; the one value
    when None): the table the packed weights carry, else made from the scales ``names`` (``pad``:
    at least this many entries, the first ones repeated)."""
    carried = ctx.tables.get(MULTIPLIERS)
    if carried is not None:
        return carried, 0.0
    a = ctx.attrs
    m = multiplier(*(a[n] for n in names))
    if m.size == 1:
        return None, float(m[0])
    return qm.table(ctx.b, f"{ctx.name}.m", np.resize(m, max(pad, m.size)), h.F32), 0.0


def multiplier_at(b: ir.IRBuilder, mults: tuple[ir.Value | None, float], row: ir.Value) -> ir.Value:
    """Row ``row``'s float32 multiplier, from what :func:`multipliers` gave."""
    mtab, m_one = mults
    return h.load(b, mtab, row) if mtab is not None else ir.Constant(h.F32, m_one)


def encoding(x_dtype: DType, dot: Dot) -> tuple[bool, int]:
    """(flip the sign bit of each activation byte, what that adds to the zero point)."""
    if x_dtype is DType.I8 and not dot.u_signed:
        return True, 128
    if x_dtype is DType.U8 and dot.u_signed:
        return True, -128
    return False, 0


def sums_bytes(n: int) -> int:
    return -(-4 * n // SUMS_BYTES_ALIGN) * SUMS_BYTES_ALIGN


def dot_of(key: KernelKey, target: Target, prefix: str = QUADS) -> Dot | None:
    layout = key.packed[1]
    if not layout or not layout.startswith(prefix):
        return None
    kind = layout[len(prefix):]
    dot = choose_dot(target, kind == "avx2-ubsw", tiles=kind == "amx")
    return dot if dot.kind == kind else None


def requant_epilogue(ctx: KernelContext, a, mults: tuple[ir.Value | None, float], per_row: bool, rows_sums,
                      bias, zp_enc: int, out_row: ir.Value, cols: int, dot: Dot):
    """The epilogue: + bias - zp_enc * sum(w), times the multiplier (``mults``: as ``multipliers``
    gives them), saturated, stored as bytes (or, in the float-output form, stored as float32). Its
    ``partial``: True (``cols - col`` lanes valid), False (all), or the count of valid lanes."""
    vl = dot.vl
    vt = dot.lanes_type
    ft = ir.VectorType(h.F32, vl)
    mtab, m_one = mults

    def lanes(b, ptr, col):
        return b.load(b.bitcast(gep(b, ptr, col), vt.as_pointer()), align=4)

    def epilogue(b, row, col, acc, partial):
        colv = h.i64(col) if isinstance(col, int) else col
        if per_row:
            comp = b.mul(h.load(b, rows_sums, row), h.const(h.I32, -zp_enc))
            if bias is not None:
                comp = b.add(comp, h.load(b, bias, row))
            acc = b.add(acc, qm.splat_value(b, comp, vt))
            mult = qm.splat_value(b, multiplier_at(b, mults, row), ft)
        else:
            comp = b.mul(lanes(b, rows_sums, colv), h.const(vt, -zp_enc))
            if bias is not None:
                comp = b.add(comp, lanes(b, bias, colv))
            acc = b.add(acc, comp)
            mult = (b.load(b.bitcast(gep(b, mtab, colv), ft.as_pointer()), align=4) if mtab is not None
                    else h.const(ft, m_one))
        q = qm.finish(b, acc, mult, a)
        valid = partial if not isinstance(partial, bool) else (cols - col) if partial else None
        store_bytes(b, q, gep(b, out_row(b, row), colv), valid)

    return epilogue
