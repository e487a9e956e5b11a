"""The integer GEMM on ARM ``i8mm``: ``smmla`` multiplies a 2x8 by an 8x2 int8 tile into a 2x2 int32 tile.

One ``smmla`` adds 32 byte products (two rows x two columns x eight bytes of K) where ``sdot``
adds 16, on the same quad layouts as :mod:`.int_gemm`, so the weights are packed as for ``sdot``:

* the A operand (rows r and r+1, K bytes 8o..8o+7 of each) is two 8-byte loads from the broadcast
  operand ``B`` (row r's quads at ``r * k4 * 4``);
* the B operand (columns c and c+1, the same 8 K bytes) is two quad rows of the vector operand ``V``
  (``[k4][cols_pad][4]``) interleaved by 32-bit lanes: one ``zip1`` gives columns c, c+1 and one
  ``zip2`` columns c+2, c+3 of four loaded columns.

Both operands are signed bytes (activations shifted by -128 when packed, as for ``sdot``). An odd
last quad of K is multiplied against zeros; an odd last row is left to the caller (an ``sdot`` row).
The 2x2 tiles of two column pairs are shuffled back into the ``<4 x i32>`` row vectors of four
consecutive columns that the epilogue takes, as the ``sdot`` kernel gives them.
"""

from __future__ import annotations

from llvmlite import ir

from .. import irhelpers as h
from ..irhelpers import call_named, gep

VL = 4  # int32 columns per row vector given to the epilogue
LANES = ir.VectorType(h.I32, VL)
BYTES = ir.VectorType(h.I8, 16)
PAIRS = ir.VectorType(h.I64, 2)
SMMLA = "llvm.aarch64.neon.smmla.v4i32.v16i8"
ROW_PAIRS, VECTORS = 4, 2  # a tile: 8 rows x 8 columns, 16 accumulators (of 32 NEON registers)


def _mask(idx) -> ir.Constant:
    return ir.Constant(LANES, [ir.Constant(h.I32, i) for i in idx])


def _column_pairs(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Two quad rows of four columns -> (columns 0, 1) and (columns 2, 3), each column's 8 bytes together."""
    return (b.bitcast(b.shuffle_vector(lo, hi, _mask((0, 4, 1, 5))), BYTES),
            b.bitcast(b.shuffle_vector(lo, hi, _mask((2, 6, 3, 7))), BYTES))


def _row_pair(b: ir.IRBuilder, bptr: ir.Value, k4: int, r: ir.Value, q: ir.Value, tail: bool) -> ir.Value:
    """Rows r and r+1 at quads q, q+1 (``tail``: quad q only, the other four bytes zero)."""
    def at(row: ir.Value, ty: ir.Type) -> ir.Value:
        off = b.mul(b.add(b.mul(row, h.i64(k4)), q), h.i64(4))
        return b.load(b.bitcast(gep(b, bptr, off), ty.as_pointer()), align=1)

    r1 = b.add(r, h.i64(1))
    if tail:
        v = ir.Constant(LANES, None)
        v = b.insert_element(v, at(r, h.I32), ir.Constant(h.I32, 0))
        return b.bitcast(b.insert_element(v, at(r1, h.I32), ir.Constant(h.I32, 2)), BYTES)
    v = b.insert_element(h.undef(PAIRS), at(r, h.I64), ir.Constant(h.I32, 0))
    return b.bitcast(b.insert_element(v, at(r1, h.I64), ir.Constant(h.I32, 1)), BYTES)


def _tile(b: ir.IRBuilder, geo, bptr: ir.Value, vptr: ir.Value, r0: ir.Value, c0: int | ir.Value, pairs: int,
          vectors: int, partial_last: bool, epilogue) -> None:
    """Rows r0..r0+2*pairs-1 x columns c0..c0+4*vectors-1; accumulator (p, j, h): row pair p, columns
    c0 + 4j + 2h, +1."""
    c0v = h.i64(c0) if isinstance(c0, int) else c0
    slots = []
    for _ in range(pairs * vectors * 2):
        s = h.entry_alloca(b, LANES, "mmla.acc")
        b.store(ir.Constant(LANES, None), s)
        slots.append(s)

    def vector_row(q: ir.Value, j: int) -> ir.Value:
        off = b.mul(b.add(b.mul(q, h.i64(geo.cols_pad)), b.add(c0v, h.i64(4 * j))), h.i64(4))
        return b.load(b.bitcast(gep(b, vptr, off), LANES.as_pointer()), align=1)

    def step(q: ir.Value, tail: bool) -> None:
        cols = []
        for j in range(vectors):
            hi = ir.Constant(LANES, None) if tail else vector_row(b.add(q, h.i64(1)), j)
            cols.extend(_column_pairs(b, vector_row(q, j), hi))
        for p in range(pairs):
            a = _row_pair(b, bptr, geo.k4, b.add(r0, h.i64(2 * p)), q, tail)
            for n, col in enumerate(cols):
                s = slots[p * len(cols) + n]
                b.store(call_named(b, SMMLA, LANES, [b.load(s), a, col]), s)

    if geo.k4 >= 2:
        with h.for_range(b, geo.k4 - geo.k4 % 2, step=2, name="mmla.q") as q:
            step(q, False)
    if geo.k4 % 2:
        step(h.i64(geo.k4 - 1), True)
    for p in range(pairs):
        for j in range(vectors):
            lo, hi = (b.load(slots[(p * vectors + j) * 2 + t]) for t in range(2))
            col = c0 + 4 * j if isinstance(c0, int) else b.add(c0v, h.i64(4 * j))
            for t, idx in enumerate(((0, 1, 4, 5), (2, 3, 6, 7))):  # row 2p, row 2p+1
                row = b.add(r0, h.i64(2 * p + t))
                epilogue(b, row, col, b.shuffle_vector(lo, hi, _mask(idx)), partial_last and j == vectors - 1)


def emit_mmla_gemm(b: ir.IRBuilder, geo, rows: int, bptr: ir.Value, vptr: ir.Value, epilogue) -> None:
    """Rows 0..rows-1 of C (``rows`` even; ``geo``: :class:`.int_gemm.GemmGeometry`, ``cols_pad % 4 == 0``)."""
    assert rows % 2 == 0 and geo.cols_pad % VL == 0
    vectors = max(1, min(VECTORS, geo.cols_pad // VL))
    block = vectors * VL
    full_cols = geo.cols // block * block
    rest = -(-(geo.cols - full_cols) // VL)
    partial = geo.cols % VL != 0

    def row_block(r0: ir.Value, pairs: int) -> None:
        if full_cols:
            with h.for_range(b, full_cols, step=block, name="mmla.c") as c0:
                _tile(b, geo, bptr, vptr, r0, c0, pairs, vectors, False, epilogue)
        if rest:
            _tile(b, geo, bptr, vptr, r0, full_cols, pairs, rest, partial, epilogue)

    full_rows = rows // (2 * ROW_PAIRS) * 2 * ROW_PAIRS
    if full_rows:
        with h.for_range(b, full_rows, step=2 * ROW_PAIRS, name="mmla.r") as r0:
            row_block(r0, ROW_PAIRS)
    if rows > full_rows:
        with h.for_range(b, rows, start=full_rows, step=2, name="mmla.rr") as r0:
            row_block(r0, 1)
