"""The integer GEMM on AMX-INT8 tiles (Sapphire Rapids and newer Xeons): ``C = B . V`` 16x16 at a time.

The operands are the quad layouts of :mod:`.int_gemm`, which are already AMX's: the broadcast
operand ``B`` (row r's K bytes at ``r * k4 * 4``) is a tile of 16 rows x 64 bytes, the vector operand
``V`` (``[k4][cols_pad][4]``, ``cols_pad`` a multiple of 16) a tile of 16 quad rows x 16 columns. One
tile product (``tdpbsud``: signed weights x unsigned activations, or ``tdpbusd``: the reverse) adds
16 x 16 x 64 byte products exactly into int32. The tile shapes are static per kernel: full 16-row and
16-quad tiles plus, when the geometry leaves them, a row remainder and a K remainder (8 tiles in all),
so no tile reads past an operand. Each finished C tile is stored to the stack and its rows go to the
epilogue as ``<16 x i32>`` vectors, as the vector kernels' do.

Linux hands AMX state to a process only after ``arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)``
(:func:`cuvil.edge_runtime.jit.request_amx`); without it the first tile instruction raises SIGILL.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from .. import irhelpers as h
from ..irhelpers import call_named, gep

TILE_ROWS, TILE_BYTES = 16, 64  # a tile: at most 16 rows of 64 bytes
QUADS_PER_TILE = TILE_BYTES // 4
C_FULL, A_FULL, B_FULL, A_KREM, B_KREM, C_RREM, A_RREM, A_RKREM = range(8)


def tile_config(row_rem: int, k_rem: int) -> bytes:
    """The 64-byte palette-1 configuration (``ldtilecfg``): bytes per row and rows of each tile."""
    shapes = {C_FULL: (16, 64), A_FULL: (16, 64), B_FULL: (16, 64), A_KREM: (16, 4 * k_rem), B_KREM: (k_rem, 64),
              C_RREM: (row_rem, 64), A_RREM: (row_rem, 64), A_RKREM: (row_rem, 4 * k_rem)}
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1  # palette 1
    colsb = np.zeros(16, "<u2")
    for t, (rows, nbytes) in shapes.items():
        if rows and nbytes:
            cfg[48 + t] = rows
            colsb[t] = nbytes
    cfg[16:48] = colsb.view(np.uint8)
    return cfg.tobytes()


def _imm(t: int) -> ir.Constant:
    return ir.Constant(h.I8, t)


def _load(b: ir.IRBuilder, t: int, ptr: ir.Value, stride: int) -> None:
    call_named(b, "llvm.x86.tileloadd64", h.VOID, [_imm(t), ptr, h.i64(stride)])


def emit_amx_gemm(b: ir.IRBuilder, geo, bptr: ir.Value, vptr: ir.Value, epilogue) -> None:
    """All of C in 16 x 16 tiles (``geo``: :class:`.int_gemm.GemmGeometry`, ``cols_pad % 16 == 0``)."""
    assert geo.cols_pad % 16 == 0
    full_rows, row_rem = divmod(geo.rows, TILE_ROWS)
    full_k, k_rem = divmod(geo.k4, QUADS_PER_TILE)
    cfg_bytes = tile_config(row_rem, k_rem)
    cfg = ir.GlobalVariable(b.module, ir.ArrayType(h.I8, 64), b.module.get_unique_name("amx.cfg"))
    cfg.global_constant, cfg.linkage, cfg.align = True, "private", 64
    cfg.initializer = ir.Constant(ir.ArrayType(h.I8, 64), bytearray(cfg_bytes))
    call_named(b, "llvm.x86.ldtilecfg", h.VOID, [b.bitcast(cfg, h.I8P)])
    out = h.entry_alloca(b, ir.ArrayType(h.I32, TILE_ROWS * 16), "amx.c")
    out.align = 64
    product = "llvm.x86.tdpbsud" if geo.vec_is_u else "llvm.x86.tdpbusd"  # A: the B operand, B: V
    a_stride, v_stride = 4 * geo.k4, 4 * geo.cols_pad

    def column_block(r0: ir.Value, rows: int, c0: ir.Value | int, partial: bool, c_t: int, a_t: int, ak_t: int) -> None:
        call_named(b, "llvm.x86.tilezero", h.VOID, [_imm(c_t)])
        a_row = b.mul(r0, h.i64(a_stride))
        c0v = h.i64(c0) if isinstance(c0, int) else c0

        def step(q0: ir.Value, a_tile: int, b_tile: int) -> None:
            _load(b, a_tile, gep(b, bptr, b.add(a_row, b.mul(q0, h.i64(4)))), a_stride)
            _load(b, b_tile, gep(b, vptr, b.mul(b.add(b.mul(q0, h.i64(geo.cols_pad)), c0v), h.i64(4))), v_stride)
            call_named(b, product, h.VOID, [_imm(c_t), _imm(a_tile), _imm(b_tile)])

        if full_k:
            with h.for_range(b, full_k * QUADS_PER_TILE, step=QUADS_PER_TILE, name="amx.q0") as q0:
                step(q0, a_t, B_FULL)
        if k_rem:
            step(h.i64(full_k * QUADS_PER_TILE), ak_t, B_KREM)
        call_named(b, "llvm.x86.tilestored64", h.VOID, [_imm(c_t), b.bitcast(out, h.I8P), h.i64(TILE_BYTES)])
        lanes = ir.VectorType(h.I32, 16)
        for i in range(rows):
            row = b.load(b.bitcast(gep(b, b.bitcast(out, h.I8P), i * TILE_BYTES), lanes.as_pointer()), align=64)
            epilogue(b, b.add(r0, h.i64(i)), c0, row, partial)

    full_cols = geo.cols // 16 * 16

    def block(r0: ir.Value, rows: int, c_t: int, a_t: int, ak_t: int) -> None:
        if full_cols:
            with h.for_range(b, full_cols, step=16, name="amx.c0") as c0:
                column_block(r0, rows, c0, False, c_t, a_t, ak_t)
        if geo.cols > full_cols:
            column_block(r0, rows, full_cols, True, c_t, a_t, ak_t)

    if full_rows:
        with h.for_range(b, full_rows * TILE_ROWS, step=TILE_ROWS, name="amx.r0") as r0:
            block(r0, TILE_ROWS, C_FULL, A_FULL, A_KREM)
    if row_rem:
        block(h.i64(full_rows * TILE_ROWS), row_rem, C_RREM, A_RREM, A_RKREM)
    call_named(b, "llvm.x86.tilerelease", h.VOID, [])

