"""Helpers shared by the GPU op emitters: index arithmetic, masked taps, fused epilogues."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from .. import irhelpers as h
from ..activations import fused_activation
from .context import Loop, OpContext


def lin(b: ir.IRBuilder, idx: Sequence[ir.Value], strides: Sequence[int], base: ir.Value | int = 0) -> ir.Value:
    return h.linear(b, idx, strides, base)


def store_at(ctx: OpContext, j: int, value_fn: Callable[[ir.IRBuilder, list[ir.Value]], ir.Value]) -> Loop:
    """A loop over output ``j`` storing ``value_fn(b, idx)`` at each element."""
    return Loop(tuple(ctx.out_types[j].shape), lambda b, idx, i: h.store(b, value_fn(b, idx), ctx.outs[j], i))


def masked_load(b: ir.IRBuilder, ptr: ir.Value, index: ir.Value, ok: ir.Value, fill: ir.Value) -> ir.Value:
    return b.select(ok, h.load(b, ptr, b.select(ok, index, h.i64(0))), fill)


def mac(b: ir.IRBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    """acc + x*y: one fma for floats, wrapping integer arithmetic otherwise."""
    return h.call_intrinsic(b, "llvm.fma", x, y, acc) if h.is_float(x.type) else b.add(b.mul(x, y), acc)


def in_range(b: ir.IRBuilder, pos: ir.Value, size: int) -> ir.Value:
    """0 <= pos < size for a signed i64 position (one unsigned compare)."""
    return b.icmp_unsigned("<", pos, h.i64(size))


def all_of(b: ir.IRBuilder, conds: Sequence[ir.Value]) -> ir.Value:
    out = ir.Constant(h.I1, 1)
    for c in conds:
        out = b.and_(out, c)
    return out


def fused_tail(ctx: OpContext, b: ir.IRBuilder, acc: ir.Value, i: ir.Value, n_base: int) -> ir.Value:
    """FusedConv/FusedGemm: + R (input after X, W and the bias), then the activation."""
    a = ctx.attrs
    if ctx.node_op.startswith("Fused"):
        if a["has_residual"]:
            acc = b.fadd(acc, ctx.load(n_base, i))
        acc = fused_activation(a, ctx.out_types[0].dtype)(b, acc)
    return acc


def has_bias(ctx: OpContext, plain_inputs: int) -> bool:
    return bool(ctx.attrs["has_bias"]) if ctx.node_op.startswith("Fused") else len(ctx.in_types) > plain_inputs


def acc_loop(b: ir.IRBuilder, count: int, init: ir.Value, step) -> ir.Value:
    """``step`` folded over ``range(count)`` from ``init``; an empty range (a reduction over a
    zero-length axis) reads nothing and gives ``init``."""
    if count == 0:
        return init
    return h.reduce_range(b, count, init, step) if count > 1 else step(init, h.i64(0))
