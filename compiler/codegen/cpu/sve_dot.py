"""The integer GEMM on SVE ``sdot``, vector-length agnostic: one build for every SVE register width
above 128 bits (at 128 the caller runs the NEON ``sdot`` tiles, which take fewer instructions there).

A vector holds ``vscale * 4`` int32 columns (``vscale``, read at run time, is 1 at 128 bits, 4 at
512); the column loop steps by ``NR`` such vectors and the operand loads are predicated by
``whilelt`` against the packed width, so the last block reads nothing past ``V`` whatever the width.
The operands are the quad layouts of :mod:`.int_gemm` (weights packed as for NEON ``sdot``, 4
columns to a unit, independent of the width): ``sdot z.s, z.b, z.b`` adds to each int32 lane the
dot product of one column's quad of ``V`` with the row's quad of ``B`` broadcast to every lane.

The epilogue takes ``<4 x i32>`` rows of four columns: each finished accumulator is stored to the
stack and handed over four lanes at a time, the columns past the last valid one skipped and a
partial last unit given as such. llvmlite has no scalable vector type; :class:`Scalable` spells one.
"""

from __future__ import annotations

from llvmlite import ir

from .. import irhelpers as h
from ..irhelpers import call_named, gep

UNIT = 4  # int32 columns per vector the epilogue takes
MAX_VSCALE = 16  # 2048-bit registers
MR, NR = 8, 2  # a tile: 8 rows x 2 vectors, 16 accumulators (of 32 SVE registers)
LANES = ir.VectorType(h.I32, UNIT)


class Scalable(ir.Type):
    """``<vscale x count x element>``."""

    def __init__(self, element: ir.Type, count: int):
        self.element, self.count = element, count

    def _to_string(self) -> str:
        return f"<vscale x {self.count} x {self.element}>"

    def __eq__(self, other) -> bool:
        return isinstance(other, Scalable) and (self.element, self.count) == (other.element, other.count)

    def __hash__(self) -> int:
        return hash((Scalable, str(self.element), self.count))


ACC = Scalable(h.I32, 4)
BYTES = Scalable(h.I8, 16)
PRED = Scalable(ir.IntType(1), 16)


def _ld1(b: ir.IRBuilder, ptr: ir.Value, first: ir.Value, end: ir.Value) -> ir.Value:
    """The bytes at ``ptr``, lanes whose byte offset ``first + i`` reaches ``end`` zero."""
    pred = call_named(b, "llvm.aarch64.sve.whilelt.nxv16i1.i64", PRED, [first, end])
    return call_named(b, "llvm.aarch64.sve.ld1.nxv16i8", BYTES, [pred, b.bitcast(ptr, h.I8P)])


def emit_sve_gemm(b: ir.IRBuilder, geo, bptr: ir.Value, vptr: ir.Value, epilogue) -> None:
    """All of C (``geo``: :class:`.int_gemm.GemmGeometry`, ``cols_pad % 4 == 0``)."""
    assert geo.cols_pad % UNIT == 0
    vlen = b.mul(call_named(b, "llvm.vscale.i64", h.I64, []), h.i64(UNIT))  # columns per vector
    block = b.mul(vlen, h.i64(NR))
    blocks = b.udiv(b.add(h.i64(geo.cols), b.sub(block, h.i64(1))), block)
    spill = h.entry_alloca(b, ir.ArrayType(h.I32, UNIT * MAX_VSCALE), "sve.spill")
    spill.align = 16
    full_units = geo.cols // UNIT * UNIT  # columns in whole units; the rest is one partial unit

    def tile(r0: ir.Value, rows: int, c0: ir.Value) -> None:
        slots = []
        for _ in range(rows * NR):
            s = h.entry_alloca(b, ACC, "sve.acc")
            b.store(ir.Constant(ACC, None), s)
            slots.append(s)
        with h.for_range(b, geo.k4, name="sve.q") as q:
            vecs = []
            for j in range(NR):
                col = b.add(c0, b.mul(vlen, h.i64(j)))
                first = b.mul(b.add(b.mul(q, h.i64(geo.cols_pad)), col), h.i64(4))
                end = b.mul(b.add(b.mul(q, h.i64(geo.cols_pad)), h.i64(geo.cols_pad)), h.i64(4))
                vecs.append(_ld1(b, gep(b, vptr, first), h.i64(0), b.sub(end, first)))
            for i in range(rows):
                off = b.mul(b.add(b.mul(b.add(r0, h.i64(i)), h.i64(geo.k4)), q), h.i64(4))
                quad = b.load(b.bitcast(gep(b, bptr, off), h.I32.as_pointer()), align=1)
                splat = b.bitcast(call_named(b, "llvm.aarch64.sve.dup.x.nxv4i32", ACC, [quad]), BYTES)
                for j in range(NR):
                    s = slots[i * NR + j]
                    b.store(call_named(b, "llvm.aarch64.sve.sdot.nxv4i32", ACC, [b.load(s), vecs[j], splat]), s)
        for i in range(rows):
            row = b.add(r0, h.i64(i))
            for j in range(NR):
                b.store(b.load(slots[i * NR + j]), b.bitcast(spill, ACC.as_pointer()))
                _units(b, spill, b.add(c0, b.mul(vlen, h.i64(j))), vlen, row, geo.cols, full_units, epilogue)

    with h.for_range(b, blocks, name="sve.c") as cb:
        c0 = b.mul(cb, block)
        full_rows = geo.rows // MR * MR
        if full_rows:
            with h.for_range(b, full_rows, step=MR, name="sve.r") as r0:
                tile(r0, MR, c0)
        if geo.rows > full_rows:
            with h.for_range(b, geo.rows, start=full_rows, name="sve.rr") as r0:
                tile(r0, 1, c0)


def _units(b: ir.IRBuilder, spill: ir.Value, col0: ir.Value, vlen: ir.Value, row: ir.Value, cols: int,
           full_units: int, epilogue) -> None:
    """The spilled vector's columns ``col0..col0+vlen-1`` to the epilogue, four at a time, up to ``cols``."""
    lanes_ptr = b.bitcast(spill, h.I32.as_pointer())
    with h.for_range(b, b.udiv(vlen, h.i64(UNIT)), name="sve.u") as u:
        col = b.add(col0, b.mul(u, h.i64(UNIT)))
        sums = b.load(b.bitcast(gep(b, lanes_ptr, b.mul(u, h.i64(UNIT))), LANES.as_pointer()), align=4)
        with b.if_then(b.icmp_unsigned("<", col, h.i64(full_units))):
            epilogue(b, row, col, sums, False)
        if full_units < cols:
            with b.if_then(b.icmp_unsigned("==", col, h.i64(full_units))):
                epilogue(b, row, full_units, sums, True)
