"""Data-movement kernels: views (Reshape...), Transpose, Concat, Split, Slice, Pad, Gather, Shape.

Every kernel walks its output contiguously (the innermost loop writes consecutive elements) and
computes where each element comes from; whole contiguous runs become ``memcpy``.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ....ops.common import norm_axis
from ....ops.shape import slice_bounds
from ... import irhelpers as h
from .base import KernelContext, kernel
from ...irhelpers import collapse


def _nbytes(t) -> int:
    return math.prod(t.shape) * t.dtype.itemsize


@kernel("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "BitCast")
def emit_copy(ctx: KernelContext) -> None:
    """Only reached when the planner gave the view its own storage."""
    if ctx.ins[0] is not ctx.outs[0]:
        h.memcpy(ctx.b, ctx.outs[0], ctx.ins[0], _nbytes(ctx.out_types[0]))


def emit_gather_map(ctx: KernelContext, src: ir.Value, out: ir.Value, out_shape, strides, base: int = 0) -> None:
    """out[contiguous i] = src[base + sum(i_k * strides_k)] with merged dimensions."""
    out_strides = h.contiguous_strides(out_shape)
    shape, (ocol, icol) = collapse(out_shape, [out_strides, strides])
    b = ctx.b
    if shape and icol[-1] == 1 and ocol[-1] == 1 and shape[-1] >= 16:
        size = ctx.out_types[0].dtype.itemsize
        with h.loop_nest(b, shape[:-1]) as idx:
            dst = h.gep(b, out, h.linear(b, idx, ocol[:-1]))
            h.memcpy(b, dst, h.gep(b, src, h.linear(b, idx, icol[:-1], base)), shape[-1] * size)
        return
    if len(shape) >= 2 and icol[-2] == 1 and ocol[-1] == 1 and shape[-2] * shape[-1] >= TILE * TILE:
        _tiled(b, src, out, shape, ocol, icol, base)
        return
    with h.loop_nest(b, shape) as idx:
        h.store(b, h.load(b, src, h.linear(b, idx, icol, base)), out, h.linear(b, idx, ocol))


TILE = 16  # a tile's input rows are TILE cache lines of TILE floats: all in L1 while the tile is written


def _tiled(b: ir.IRBuilder, src: ir.Value, out: ir.Value, shape, ocol, icol, base: int) -> None:
    """The last two axes swapped (the input contiguous along the second-to-last): TILE x TILE tiles,
    so the strided reads reuse the lines the tile's first row brought in (a YOLO head's (255, 320)
    transpose read a line per element: 2.3x ONNX Runtime's time)."""
    rows, cols = shape[-2], shape[-1]
    with h.loop_nest(b, shape[:-2]) as idx, \
            h.for_range(b, -(-rows // TILE), name="tr") as tr, h.for_range(b, -(-cols // TILE), name="tc") as tc:
        r0, c0 = b.mul(tr, h.i64(TILE)), b.mul(tc, h.i64(TILE))
        o0, i0 = h.linear(b, idx, ocol[:-2]), h.linear(b, idx, icol[:-2], base)
        nr = h.call_intrinsic(b, "llvm.smin", b.sub(h.i64(rows), r0), h.i64(TILE))
        nc = h.call_intrinsic(b, "llvm.smin", b.sub(h.i64(cols), c0), h.i64(TILE))
        with h.for_range(b, nr, name="r") as dr, h.for_range(b, nc, name="c") as dc:
            r, c = b.add(r0, dr), b.add(c0, dc)
            at = b.add(i0, b.add(r, b.mul(c, h.i64(icol[-1]))))
            h.store(b, h.load(b, src, at), out, b.add(o0, b.add(b.mul(r, h.i64(ocol[-2])), c)))


@kernel("Transpose")
def emit_transpose(ctx: KernelContext) -> None:
    in_strides = h.contiguous_strides(ctx.shape(0))
    perm = ctx.attrs["perm"]
    emit_gather_map(ctx, ctx.ins[0], ctx.outs[0], ctx.out_shape, [in_strides[p] for p in perm])


@kernel("Slice")
def emit_slice(ctx: KernelContext) -> None:
    shape = ctx.shape(0)
    strides = h.contiguous_strides(shape)
    bounds = [s.indices(d) for s, d in zip(slice_bounds(shape, ctx.attrs), shape)]
    base = sum(start * st for (start, _, _), st in zip(bounds, strides))
    emit_gather_map(ctx, ctx.ins[0], ctx.outs[0], ctx.out_shape, [step * st for (_, _, step), st in zip(bounds, strides)], base)


@kernel("Concat")
def emit_concat(ctx: KernelContext) -> None:
    out_shape = ctx.out_shape
    axis = norm_axis("Concat", ctx.attrs["axis"], len(out_shape))
    out_strides = h.contiguous_strides(out_shape)
    offset = 0
    for i, t in enumerate(ctx.in_types):
        shape = tuple(t.shape)
        if math.prod(shape):
            sub = _Sub(ctx, out_shape, out_strides, offset * out_strides[axis])
            sub.copy_from(ctx.ins[i], shape)
        offset += shape[axis]


@kernel("Split")
def emit_split(ctx: KernelContext) -> None:
    shape = ctx.shape(0)
    axis = norm_axis("Split", ctx.attrs["axis"], len(shape))
    in_strides = h.contiguous_strides(shape)
    offset = 0
    for j, t in enumerate(ctx.out_types):
        part = tuple(t.shape)
        if math.prod(part):
            emit_gather_map(ctx, ctx.ins[0], ctx.outs[j], part, in_strides, offset * in_strides[axis])
        offset += part[axis]


class _Sub:
    """A strided window of the output (Concat's destination for one operand)."""

    def __init__(self, ctx: KernelContext, out_shape, out_strides, base: int):
        self.ctx, self.out_strides, self.base = ctx, out_strides, base

    def copy_from(self, src: ir.Value, shape) -> None:
        ctx, b = self.ctx, self.ctx.b
        in_strides = h.contiguous_strides(shape)
        dims, (ocol, icol) = collapse(shape, [self.out_strides, in_strides])
        size = ctx.out_types[0].dtype.itemsize
        if dims and ocol[-1] == 1 and icol[-1] == 1 and dims[-1] >= 16:
            with h.loop_nest(b, dims[:-1]) as idx:
                dst = h.gep(b, ctx.outs[0], h.linear(b, idx, ocol[:-1], self.base))
                h.memcpy(b, dst, h.gep(b, src, h.linear(b, idx, icol[:-1])), dims[-1] * size)
            return
        with h.loop_nest(b, dims) as idx:
            h.store(b, h.load(b, src, h.linear(b, idx, icol)), ctx.outs[0], h.linear(b, idx, ocol, self.base))


@kernel("Pad")
def emit_pad(ctx: KernelContext) -> None:
    """Each output coordinate maps to an input coordinate per axis (or to the constant)."""
    shape, out_shape = ctx.shape(0), ctx.out_shape
    rank, b = len(shape), ctx.b
    pads, mode = ctx.attrs["pads"], ctx.attrs["mode"]
    begins = pads[:rank]
    in_strides = h.contiguous_strides(shape)
    ty = h.LLTYPE[ctx.in_types[0].dtype]
    with h.loop_nest(b, out_shape) as idx:
        inside: ir.Value = ir.Constant(h.I1, 1)
        src = h.i64(0)
        for k in range(rank):
            j = b.sub(idx[k], h.i64(begins[k]))
            d = h.i64(shape[k])
            if mode == "constant":
                ok = b.and_(b.icmp_signed(">=", j, h.i64(0)), b.icmp_signed("<", j, d))
                inside = b.and_(inside, ok)
                j = b.select(ok, j, h.i64(0))
            elif mode == "edge":
                j = b.select(b.icmp_signed("<", j, h.i64(0)), h.i64(0), j)
                j = b.select(b.icmp_signed(">=", j, d), h.i64(shape[k] - 1), j)
            else:  # reflect
                j = b.select(b.icmp_signed("<", j, h.i64(0)), b.sub(h.i64(0), j), j)
                j = b.select(b.icmp_signed(">=", j, d), b.sub(h.i64(2 * (shape[k] - 1)), j), j)
            src = b.add(src, b.mul(j, h.i64(in_strides[k])))
        val = h.load(b, ctx.ins[0], src) if math.prod(shape) else h.const(ty, 0)
        if mode == "constant":
            val = b.select(inside, val, h.const(ty, ctx.attrs["value"]))
        h.store(b, val, ctx.outs[0], h.linear(b, idx, h.contiguous_strides(out_shape)))


@kernel("Gather")
def emit_gather(ctx: KernelContext) -> None:
    """out[outer, j, inner] = data[outer, idx[j], inner], a negative index counting from the end.

    An index outside [-dim, dim) (any index of an empty axis) is refused as the reference refuses
    it: the kernel sets the fault word and writes zeros instead of reading outside ``data``. With
    no outer rows the indices are still checked, as the reference checks them."""
    data, idx_t = ctx.shape(0), ctx.shape(1)
    axis = norm_axis("Gather", ctx.attrs["axis"], len(data))
    outer, dim, inner = math.prod(data[:axis]), data[axis], math.prod(data[axis + 1:])
    count = math.prod(idx_t)
    b = ctx.b
    zero = h.const(h.LLTYPE[ctx.out_types[0].dtype], 0)

    def index(j):
        raw = ctx.read(1, j)
        k = b.sext(raw, h.I64) if raw.type != h.I64 else raw
        k = b.select(b.icmp_signed("<", k, h.i64(0)), b.add(k, h.i64(dim)), k)
        return k, b.and_(b.icmp_signed(">=", k, h.i64(0)), b.icmp_signed("<", k, h.i64(dim)))

    if outer == 0:
        with h.for_range(b, count, name="j") as j:
            with b.if_then(b.not_(index(j)[1])):
                ctx.set_fault()
        return
    with h.for_range(b, outer, name="o") as o, h.for_range(b, count, name="j") as j:
        k, inside = index(j)
        src = b.add(b.mul(o, h.i64(dim * inner)), b.mul(k, h.i64(inner)))
        dst = b.add(b.mul(o, h.i64(count * inner)), b.mul(j, h.i64(inner)))
        with b.if_else(inside) as (then, otherwise):
            with then:
                with h.for_range(b, inner, name="e") as e:
                    h.store(b, h.load(b, ctx.ins[0], b.add(src, e)), ctx.outs[0], b.add(dst, e))
            with otherwise:
                ctx.set_fault()
                with h.for_range(b, inner, name="z") as e:
                    h.store(b, zero, ctx.outs[0], b.add(dst, e))


@kernel("Shape")
def emit_shape(ctx: KernelContext) -> None:
    for i, d in enumerate(ctx.shape(0)):
        h.store(ctx.b, h.i64(d), ctx.outs[0], i)
