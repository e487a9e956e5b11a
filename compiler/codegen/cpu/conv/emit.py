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
"""

from __future__ import annotations

from llvmlite import ir

from ....target import Target
from ...irhelpers import PREVECTORIZED, set_fn_attrs
from ..vecops import define_kernel
from .dilated import emit_dilated_winograd
from .direct import emit_direct
from .dwflat import emit_depthwise_flat
from .dwlanes import emit_depthwise_lanes
from .dwstride2 import emit_depthwise_stride2
from .plan import conv_plan
from .rows import emit_conv_rows
from .winograd import emit_winograd


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
    fn = define_kernel(module, name, target)
    epilogue = dict(bias=bias, residual=residual, activation=activation, act_alpha=act_alpha, act_beta=act_beta)
    if p.method == "winograd" and p.dh > 1:
        emit_dilated_winograd(fn, p, target, **epilogue)
    elif p.method == "winograd":
        emit_winograd(fn, target, N, C, H, W, OC, pads, m=p.mr, blocks=blocks, **epilogue)
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
