"""2-D convolution over NCHW for a Target: one kernel function, whichever method the plan picks.

``emit_conv2d(module, name, target, N, C, H, W, OC, KH, KW, strides=(1, 1), pads=(0, 0, 0, 0),
dilations=(1, 1), group=1, *, bias=False, residual=False, activation="none", act_alpha=0.0,
act_beta=0.0) -> ir.Function`` defines::

    void name(float* noalias X, float* noalias Wpacked, float* noalias bias_or_null,
              float* residual_or_null, float* Y, float* noalias scratch_or_null)

X: [N, C, H, W]; Wpacked: ``pack.pack_conv_weights(W, target, (N, C, H, W), strides, pads,
dilations, group)``; bias: [OC]; residual and Y: [N, OC, OH, OW]; scratch:
``plan.conv_scratch_bytes(...)`` bytes (null when 0), any alignment, clobbered. pads are ONNX
order (top, left, bottom, right). Y = act(conv + bias + residual), as FusedConv. Y must not alias
X; it may alias residual.

A part of a layer split by rows (``blocks``) runs the same code as its sibling parts over other blocks: a
Winograd or banded direct part is a call of one body shared by the layer's parts, its blocks passed as
arguments (:func:`_ranged_body`), so a layer split in two is emitted and compiled once, not twice (its
parts' code differed in two loop bounds only: ResNet-18 at 2 threads printed 220 of its 1,390 kB twice).
"""

from __future__ import annotations


from llvmlite import ir

from ....digest import short_hex
from ....target import Target
from ...irhelpers import I64, PREVECTORIZED, i64, set_fn_attrs
from ..vecops import define_kernel
from .dilated import emit_dilated_winograd
from .direct import emit_direct
from .dwflat import emit_depthwise_flat
from .dwlanes import emit_depthwise_lanes
from .dwstride2 import emit_depthwise_stride2
from .layout import ConvPlan
from .plan import conv_plan
from .rows import emit_conv_rows
from .winograd import emit_winograd
from .winograd_geometry import WinogradGeometry


def emit_conv2d(module: ir.Module, name: str, target: Target, N: int, C: int, H: int, W: int, OC: int,
                KH: int, KW: int, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1, *,
                bias: bool = False, residual: bool = False, activation: str = "none",
                act_alpha: float = 0.0, act_beta: float = 0.0, blocks: tuple[int, int] | None = None) -> ir.Function:
    """Define ``name`` in ``module`` (signature in the module docstring) and return it. ``blocks``: the
    blocks of output this kernel runs (a part of a layer split by rows), default all: a Winograd conv's blocks
    of tile rows, a banded direct conv's bands, an uncopied direct conv's pixel-vector slots."""
    p = conv_plan(target, N, C, H, W, OC, KH, KW, strides, pads, dilations, group)
    by_rows = (p.method == "winograd" and p.dh == 1) or (p.method == "direct" and p.band < p.OH) or p.by_slots
    if blocks is not None and not by_rows:
        raise ValueError(f"emit_conv2d: blocks of output are a Winograd, banded or uncopied direct conv's, not this "
                         f"{p.method} conv's")
    epilogue = dict(bias=bias, residual=residual, activation=activation, act_alpha=act_alpha, act_beta=act_beta)
    ranged = blocks is not None and not p.by_slots  # a Winograd or banded conv's part: the layer's body over its blocks
    if ranged and not 0 <= blocks[0] < blocks[1] <= (n := _block_count(p, target, pads)):
        raise ValueError(f"emit_conv2d: blocks {blocks[0]}..{blocks[1]} of a layer of {n} "
                         f"({'tile rows' if p.method == 'winograd' else 'bands'})")
    fn = define_kernel(module, name, target)
    if ranged:
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.call(_ranged_body(module, p, target, pads, epilogue), [*fn.args, *map(i64, blocks)])
        b.ret_void()
    elif p.method == "winograd" and p.dh > 1:
        emit_dilated_winograd(fn, p, target, **epilogue)
    elif p.method == "winograd":
        emit_winograd(fn, target, N, C, H, W, OC, pads, m=p.mr, **epilogue)
    elif p.method == "dwlanes":
        emit_depthwise_lanes(fn, p, scalar_tails=not target.tuning.masked_stores, **epilogue)
    elif p.method == "dwflat":
        emit_depthwise_flat(fn, p, scalar_tails=not target.tuning.masked_stores, **epilogue)
    elif p.method == "dwstride2":
        emit_depthwise_stride2(fn, p, scalar_tails=not target.tuning.masked_stores, **epilogue)
    elif p.method == "rows":
        emit_conv_rows(fn, p, target, **epilogue)
    else:
        emit_direct(fn, p, target, blocks=blocks, **epilogue)
    set_fn_attrs(fn, strings={PREVECTORIZED: "true"})
    return fn


def _block_count(p: ConvPlan, target: Target, pads) -> int:
    """Blocks of a Winograd conv's tile rows, or bands of a banded direct conv, as their emitters cut them."""
    if p.method == "winograd":
        return WinogradGeometry.for_tuning(target.vector_floats, p.C, p.H, p.W, p.OC, pads, p.mr, target.tuning).nblk
    return -(-p.OH // p.band)


def _ranged_body(module: ir.Module, p: ConvPlan, target: Target, pads, epilogue: dict) -> ir.Function:
    """``void body(X, W, bias, residual, Y, scratch, i64 first, i64 end)``: the Winograd or banded direct conv of
    ``p`` over its blocks ``[first, end)``, defined once per module (named by everything its code depends on;
    internal and noinline, as a shared helper), so that every part of the layer calls the same code."""
    key = repr((target, p, sorted(epilogue.items())))
    name = f"conv_part_{short_hex(key, 16)}"
    if (fn := module.globals.get(name)) is not None:
        return fn
    fn = define_kernel(module, name, target, extra=(I64, I64))
    fn.linkage = "internal"
    set_fn_attrs(fn, ("noinline",), strings={PREVECTORIZED: "true"})
    blocks = (fn.args[6], fn.args[7])
    if p.method == "winograd":
        emit_winograd(fn, target, p.N, p.C, p.H, p.W, p.OC, pads, m=p.mr, blocks=blocks, **epilogue)
    else:
        emit_direct(fn, p, target, blocks=blocks, **epilogue)
    return fn
