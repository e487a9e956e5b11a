"""The integer GEMM micro-kernel: int32 tiles of quad dot products, requantized in the epilogue.

``C[r, c] = sum_q dot(B[r, q], V[q, c])``: ``B`` is the broadcast operand (row r's unit q, 4 bytes at
``(r * k4 + q) * 4``), ``V`` the vector operand (unit-interleaved ``[k4][cols_pad][4]`` bytes, so one
vector load brings unit q of VL consecutive columns). A unit is a quad of bytes, or two int16 for
``avx2-wd`` (``Dot.per_unit``). A conv broadcasts its weights (rows = output
channels) over pixels packed from the activations; a matmul broadcasts activation rows over packed
weight columns. Tiles of MR rows x NR vectors keep their accumulators in registers; the epilogue
gets each finished ``<VL x i32>`` vector with its row and first column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from ...target import Target
from .. import irhelpers as h
from .amx import emit_amx_gemm
from .int_dot import Dot
from .mmla import emit_mmla_gemm
from .sve_dot import emit_sve_gemm
from ..irhelpers import call_named, gep

Epilogue = Callable[[ir.IRBuilder, ir.Value, "int | ir.Value", ir.Value, bool], None]
"""(builder, row index (i64), first column, <VL x i32> sums, partial: fewer than VL valid columns)."""


@dataclass(frozen=True)
class GemmGeometry:
    rows: int
    cols: int  # valid columns
    cols_pad: int  # columns in V, a multiple of VL
    k4: int  # 4-byte units along K (quads; int16 pairs for avx2-wd)
    vec_is_u: bool  # V holds the u operand (activations), B the s operand (weights); else the reverse
    prefetch_blocks: int = 0  # column blocks of V prefetched ahead (weights streamed from L3; costs load slots)


SKEW_PERIOD, SKEW_UNITS = 1024, 16  # a V row stride that is a multiple of 1 KiB gets 64 more bytes
LINE_UNITS = 16  # 4-byte units a cache line holds


def padded_cols(cols: int, dot: Dot) -> int:
    """V's row length in units: whole vectors, skewed off strides that would fight over a few cache sets."""
    pad = -(-cols // dot.vl) * dot.vl
    return pad + SKEW_UNITS if (4 * pad) % SKEW_PERIOD == 0 else pad


def tile(dot: Dot, target: Target, cols_pad: int) -> tuple[int, int]:
    """(MR, NR): NR vectors of columns (no more than there are), MR rows filling the registers."""
    nr = max(1, min(4 if target.tuning.vector_registers == 32 else 2, cols_pad // dot.vl))
    spare = target.tuning.vector_registers - nr - 2 - (2 if dot.kind == "avx2-ubsw" else 0)
    mr = max(1, min(8, spare // nr))
    return mr, nr


def _splat_quad(b: ir.IRBuilder, dot: Dot, ptr: ir.Value) -> ir.Value:
    quad = b.load(b.bitcast(ptr, h.I32.as_pointer()), align=1)
    v = b.insert_element(h.undef(dot.lanes_type), quad, ir.Constant(h.I32, 0))
    v = b.shuffle_vector(v, h.undef(dot.lanes_type), h.vector(dot.lanes_type, None))
    return b.bitcast(v, dot.bytes_type)


def _tile(b: ir.IRBuilder, dot: Dot, geo: GemmGeometry, bptr: ir.Value, vptr: ir.Value, r0: ir.Value,
          c0: int | ir.Value, mr: int, nr: int, partial_last: bool, epilogue: Epilogue, ahead: int = 0,
          next_rows: bool = False) -> None:
    """One tile of MR rows x NR vectors; ``ahead``: V's later column block prefetched; ``next_rows``: the
    next tile's B rows prefetched a line each per ``LINE_UNITS`` units, as this tile passes them (after the
    last tile, lines past B: a hint, which never faults)."""
    slots = []
    for _ in range(mr * nr):
        s = h.entry_alloca(b, dot.lanes_type, "acc")
        b.store(ir.Constant(dot.lanes_type, None), s)
        slots.append(s)
    c0v = h.i64(c0) if isinstance(c0, int) else c0

    def b_unit(row: ir.Value, q: ir.Value) -> ir.Value:
        """Where row ``row``'s unit ``q`` of B lies."""
        return gep(b, bptr, b.mul(b.add(b.mul(row, h.i64(geo.k4)), q), h.i64(4)))

    with h.for_range(b, geo.k4, name="q") as q:
        vrow = b.mul(q, h.i64(geo.cols_pad))
        vecs = []
        for j in range(nr):
            off = b.mul(b.add(vrow, b.add(c0v, h.i64(j * dot.vl))), h.i64(4))
            vecs.append(b.load(b.bitcast(gep(b, vptr, off), dot.bytes_type.as_pointer()), align=1))
        for line in range(0, nr * dot.vl * 4, 64) if ahead else ():  # the same row of a later block
            h.prefetch(b, gep(b, vptr, b.add(b.mul(b.add(vrow, c0v), h.i64(4)), h.i64(ahead * nr * dot.vl * 4 + line))))
        if next_rows:
            with b.if_then(b.icmp_unsigned("==", b.and_(q, h.i64(LINE_UNITS - 1)), h.i64(0))):
                for i in range(mr):
                    h.prefetch(b, b_unit(b.add(r0, h.i64(mr + i)), q))
        for i in range(mr):
            quad = _splat_quad(b, dot, b_unit(b.add(r0, h.i64(i)), q))
            for j in range(nr):
                s = slots[i * nr + j]
                u, w = (vecs[j], quad) if geo.vec_is_u else (quad, vecs[j])
                b.store(dot.step(b, b.load(s), u, w), s)
    for i in range(mr):
        row = b.add(r0, h.i64(i))
        for j in range(nr):
            col = c0 + j * dot.vl if isinstance(c0, int) else b.add(c0v, h.i64(j * dot.vl))
            epilogue(b, row, col, b.load(slots[i * nr + j]), partial_last and j == nr - 1)


def emit_int_gemm(b: ir.IRBuilder, dot: Dot, target: Target, geo: GemmGeometry, bptr: ir.Value, vptr: ir.Value,
                  epilogue: Epilogue) -> None:
    """All of C, tile by tile: full row blocks, then single rows; full column blocks, then the rest
    (on AMX tiles: :mod:`.amx`; on ARM i8mm: row pairs by :mod:`.mmla`, an odd last row here; SVE
    ``sdot``: :mod:`.sve_dot` on registers wider than 128 bits, the NEON tiles here at 128, where they
    take fewer instructions)."""
    if dot.kind == "amx":
        emit_amx_gemm(b, geo, bptr, vptr, epilogue)
        return
    if dot.kind == "sve-sdot":
        wide = b.icmp_unsigned(">", call_named(b, "llvm.vscale.i64", h.I64, []), h.i64(1))
        with b.if_else(wide) as (sve, neon):
            with sve:
                emit_sve_gemm(b, geo, bptr, vptr, epilogue)
            with neon:
                _vector_gemm(b, dot, target, geo, bptr, vptr, epilogue, 0)
        return
    first = 0
    if dot.kind == "i8mm":
        first = geo.rows - geo.rows % 2
        if first:
            emit_mmla_gemm(b, geo, first, bptr, vptr, epilogue)
    _vector_gemm(b, dot, target, geo, bptr, vptr, epilogue, first)


def _vector_gemm(b: ir.IRBuilder, dot: Dot, target: Target, geo: GemmGeometry, bptr: ir.Value, vptr: ir.Value,
                 epilogue: Epilogue, first: int) -> None:
    """Rows ``first``.. of C in the fixed-width tiles of ``dot``."""
    mr, nr = tile(dot, target, geo.cols_pad)
    block = nr * dot.vl
    full_cols = (geo.cols // block) * block
    rest = -(-(geo.cols - full_cols) // dot.vl)  # vectors after the full blocks
    partial = geo.cols % dot.vl != 0

    full_rows = first + (geo.rows - first) // mr * mr

    ahead = geo.prefetch_blocks
    next_rows = geo.vec_is_u and target.tuning.int8_prefetch_weight_rows  # B: a conv's weights, MR short streams a tile

    def column_block(c0: int | ir.Value, vectors: int, partial_last: bool) -> None:
        """Every row against one block of columns, whose slice of V stays in L1 while the rows pass.
        Its first pass brings the slice one line a row of V, a stride the hardware prefetcher follows
        too late when V is weights from L3 (Winograd's 2 MiB of int16 weights a 256-channel conv), so a
        later block's lines can be prefetched meanwhile (``GemmGeometry.prefetch_blocks``)."""
        if full_rows > first:
            with h.for_range(b, full_rows, start=first, step=mr, name="r") as r0:
                _tile(b, dot, geo, bptr, vptr, r0, c0, mr, vectors, partial_last, epilogue, ahead, next_rows)
        if geo.rows > full_rows:  # the last rows in one shorter tile: each pass over V costs the same
            _tile(b, dot, geo, bptr, vptr, h.i64(full_rows), c0, geo.rows - full_rows, vectors, partial_last, epilogue,
                  ahead)

    if full_cols:
        with h.for_range(b, full_cols, step=block, name="c") as c0:
            column_block(c0, nr, False)
    if rest:
        column_block(full_cols, rest, partial)


def store_bytes(b: ir.IRBuilder, v: ir.Value, ptr: ir.Value, valid: int | None) -> None:
    """Store ``<VL x i8>`` at ``ptr`` (``i8*``): all lanes, or the first ``valid`` one by one."""
    if valid is None:
        b.store(v, b.bitcast(ptr, v.type.as_pointer()), align=1)
        return
    for lane in range(valid):
        b.store(b.extract_element(v, ir.Constant(h.I32, lane)), gep(b, ptr, lane), align=1)


def store_lanes(b: ir.IRBuilder, q: ir.Value, ptr: ir.Value, valid: int | None, masked: bool) -> None:
    """``<VL x i8>`` at ``ptr``: whole, or its first ``valid`` lanes (a masked store where cheap)."""
    if valid is None or not masked:
        store_bytes(b, q, ptr, valid)
        return
    h.masked_store(b, q, ptr, h.vector(ir.VectorType(h.I1, q.type.count), [i < valid for i in range(q.type.count)]), 1)
