"""Elementwise kernels: one broadcasting loop nest around each op's element emitter (``scalar_ops``).

Broadcast dimensions get stride 0, adjacent dimensions that every operand walks contiguously are
merged, so the innermost loop is as long as possible and each operand is either contiguous or
loop-invariant there: the shape LLVM's loop vectorizer turns into full-width vector code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from ...ir.dtypes import DType
from ...ops.fused import parse_program
from .. import irhelpers as h
from ..halfprec import float_convert
from ..scalar_ops import ELEMENT_EMITTERS, scalar_fn
from .base import KernelContext, kernel


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a contiguous ``shape`` read at ``out_shape`` positions (0: broadcast)."""
    pad = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides = h.contiguous_strides(pad)
    return tuple(0 if d == 1 and o != 1 else s for d, o, s in zip(pad, out_shape, strides))


def collapse(out_shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent dimensions every operand walks as one; drop size-1 dimensions."""
    dims = [i for i, d in enumerate(out_shape) if d != 1]
    shape: list[int] = []
    cols: list[list[int]] = [[] for _ in strides]
    for i in dims:
        d = out_shape[i]
        if shape and all(col[-1] == st[i] * d for col, st in zip(cols, strides)):
            shape[-1] *= d
            for col, st in zip(cols, strides):
                col[-1] = st[i]
            continue
        shape.append(d)
        for col, st in zip(cols, strides):
            col.append(st[i])
    return tuple(shape), [tuple(c) for c in cols]


def emit_map(ctx: KernelContext, fn: Callable[[list[ir.Value]], ir.Value], inputs: Sequence[int]) -> None:
    """out[i] = fn(in_k[broadcast(i)] for k in inputs) over the output's shape."""
    out_shape = ctx.out_shape
    strides = [broadcast_strides(ctx.out_shape, out_shape)] + [broadcast_strides(ctx.shape(i), out_shape) for i in inputs]
    shape, cols = collapse(out_shape, strides)
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
def _cast(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """NumPy ``astype`` semantics (float->int truncates; anything->bool is != 0)."""
    st, dt = h.LLTYPE[src], h.LLTYPE[dst]
    if dst is DType.BOOL:
        nz = b.fcmp_unordered("!=", x, h.const(st, 0)) if src.is_float else b.icmp_unsigned("!=", x, ir.Constant(st, 0))
        return b.zext(nz, h.I8)
    if src.is_float and dst.is_float:
        return float_convert(b, x, dt)
    if src.is_float:
        return b.fptosi(x, dt) if dst in h.SIGNED else b.fptoui(x, dt)
    if dst.is_float:
        return b.sitofp(x, dt) if src in h.SIGNED else b.uitofp(x, dt)
    if st.width == dt.width:
        return x
    if st.width > dt.width:
        return b.trunc(x, dt)
    return b.sext(x, dt) if src in h.SIGNED else b.zext(x, dt)


@kernel("Cast", scalars=True)
def emit_cast(ctx: KernelContext) -> None:
    src, dst = ctx.in_types[0].dtype, ctx.out_types[0].dtype
    emit_map(ctx, lambda xs: _cast(ctx.b, xs[0], src, dst), [0])
