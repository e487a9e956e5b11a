"""The fused epilogue of FusedConv / FusedGemm: y = activation(y + R), applied to a finished tile."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llvmlite import ir

from ...ops.fused import ACTIVATIONS
from .. import irhelpers as h
from ..activations import ACTIVATION_EMITTERS
from .elementwise import check_dtype


def activation_fn(attrs: Mapping, dtype) -> Callable[[ir.IRBuilder, ir.Value], ir.Value] | None:
    name = attrs.get("activation", "none")
    if name == "none":
        return None
    check_dtype(ACTIVATIONS[name].op, dtype)
    emit, alpha, beta = ACTIVATION_EMITTERS[name], attrs["act_alpha"], attrs["act_beta"]
    return lambda b, v: emit(b, v, alpha, beta)


def residual_index(attrs: Mapping) -> int | None:
    """Input index of R in a fused node (after X, W and the optional bias)."""
    return 2 + attrs["has_bias"] if attrs.get("has_residual") else None


def residual_inplace(attrs: Mapping, i: int) -> bool:
    """Only R may share the output's storage: the kernel then starts from it instead of zero."""
    return i == residual_index(attrs)


def residual_shared(ctx) -> bool:
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
