"""The fused epilogue of FusedConv / FusedGemm: y = activation(y + R), applied to a finished tile."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llvmlite import ir

from ....ops.fused import residual_index
from ... import irhelpers as h
from ...activations import fused_activation


def activation_fn(attrs: Mapping, dtype) -> Callable[[ir.IRBuilder, ir.Value], ir.Value] | None:
    return None if attrs.get("activation", "none") == "none" else fused_activation(attrs, dtype)


def residual_shared(ctx) -> bool:
    """R shares the output's storage (``residual_input``): the kernel then starts from it instead of zero."""
    r = residual_index(ctx.attrs)
    return r is not None and ctx.key.alias[r] is not None


def apply_epilogue(b: ir.IRBuilder, ctx, base: ir.Value, count: int) -> None:
    """In place over out[base : base + count] (contiguous): add R, then the activation."""
    attrs = ctx.attrs
    act = activation_fn(attrs, ctx.out_types[0].dtype)
    r = None if residual_shared(ctx) else residual_index(attrs)
    if act is None and r is None:
        return
    y = ctx.outs[0]
    with h.for_range(b, count, name="ep") as j:
        k = b.add(base, j)
        v = h.load(b, y, k)
        if r is not None:
            v = b.fadd(v, ctx.read(r, k))
        if act is not None:
            v = act(b, v)
        h.store(b, v, y, k)
