"""Elementwise kernels: one broadcasting loop nest around each op's element emitter (``scalar_ops``).

Broadcast dimensions get stride 0, adjacent dimensions that every operand walks contiguously are
merged, so the innermost loop is as long as possible and each operand is either contiguous or
loop-invariant there: the shape LLVM's loop vectorizer turns into full-width vector code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from ....ops.fused import parse_program
from ... import irhelpers as h
from ...scalar_ops import ELEMENT_EMITTERS, cast_value, scalar_fn
from .base import KernelContext, kernel


def emit_map(ctx: KernelContext, fn: Callable[[list[ir.Value]], ir.Value], inputs: Sequence[int]) -> None:
    """out[i] = fn(in_k[broadcast(i)] for k in inputs) over the output's shape."""
    out_shape = ctx.out_shape
    strides = [h.broadcast_strides(ctx.out_shape, out_shape)] + [h.broadcast_strides(ctx.shape(i), out_shape) for i in inputs]
    shape, cols = h.collapse(out_shape, strides)
    b = ctx.b
    with h.loop_nest(b, shape) as idx:
        vals = [ctx.read(i, h.linear(b, idx, col)) for i, col in zip(inputs, cols[1:])]
        h.store(b, fn(vals), ctx.outs[0], h.linear(b, idx, cols[0]))


@kernel(*ELEMENT_EMITTERS, scalars=True)
def emit_elementwise(ctx: KernelContext) -> None:
    fn = scalar_fn(ctx.key.op, ctx.attrs, ctx.in_types[0].dtype)
    emit_map(ctx, lambda xs: fn(ctx.b, xs), range(len(ctx.in_types)))


@kernel("Where", scalars=True)
def emit_where(ctx: KernelContext) -> None:
    b = ctx.b
    emit_map(ctx, lambda xs: b.select(b.icmp_unsigned("!=", xs[0], ir.Constant(h.I8, 0)), xs[1], xs[2]), range(3))


@kernel("FusedElementwise", scalars=True)
def emit_fused_elementwise(ctx: KernelContext) -> None:
    steps = parse_program(ctx.attrs["program"])
    dtype = ctx.in_types[0].dtype
    fns = [scalar_fn(s.op, dict(s.attrs), dtype) for s in steps]

    def run(xs: list[ir.Value]) -> ir.Value:
        slots = list(xs)
        for s, fn in zip(steps, fns):
            slots.append(fn(ctx.b, [slots[i] for i in s.args]))
        return slots[-1]

    emit_map(ctx, run, range(len(ctx.in_types)))


# ---------------------------------------------------------------------------------------- Cast ---
@kernel("Cast", scalars=True)
def emit_cast(ctx: KernelContext) -> None:
    src, dst = ctx.in_types[0].dtype, ctx.out_types[0].dtype
    saturate, mode = bool(ctx.attrs["saturate"]), ctx.attrs["round_mode"]
    emit_map(ctx, lambda xs: cast_value(ctx.b, xs[0], src, dst, saturate, mode), [0])
