"""Kernels of the ops whose element code both backends share (``codegen/gathers``): one loop nest over
the output, the shared code computing each element."""

from __future__ import annotations

from ... import irhelpers as h
from ...gathers import PER_ELEMENT
from ...sequential import SEQUENTIAL
from .base import KernelContext, kernel


@kernel(*sorted(set(PER_ELEMENT) - {"Resize"}))  # Resize: kernels/resize.py, which falls back to this one
def emit_per_element(ctx: KernelContext) -> None:
    value = PER_ELEMENT[ctx.key.op](ctx.attrs, ctx.in_types, ctx.out_types)
    shape = ctx.out_shape
    strides = h.contiguous_strides(shape)
    with h.loop_nest(ctx.b, shape) as idx:
        ptrs = list(ctx.ins) + ([ctx.fault] if ctx.fault is not None else [])
        h.store(ctx.b, value(ctx.b, list(idx), ptrs), ctx.outs[0], h.linear(ctx.b, idx, strides))


@kernel(*SEQUENTIAL)
def emit_sequential(ctx: KernelContext) -> None:
    """One pass over the whole op (``codegen/sequential``): a bounded result, then its valid length."""
    SEQUENTIAL[ctx.key.op](ctx.b, ctx.attrs, ctx.in_types, ctx.out_types, ctx.ins, ctx.outs[0])
