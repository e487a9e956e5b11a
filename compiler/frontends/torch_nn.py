"""ATen → Cuvil translators for layers: matrix products, attention, convolution, normalization, pooling.

Registered into :data:`~cuvil.compiler.frontends.torch_ops.TABLE` on import (``torch.py`` imports it).
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import DType
from ..ops.registry import get_op
from ..ops.resample import resize_taps
from . import norm_compose
from .builder import Unsupported
from .torch_ops import Translator, op, pair


# --- linear algebra ---------------------------------------------------------------------------------
@op("linear")
def _linear(c, a):
    x, w, b = a["input"], a["weight"], a.get("bias")
    if c.rank(x) == 2:
        return c.op("Gemm", [x, w] + ([b] if b else []), transB=1)
    y = c.op("MatMul", [x, c.b.add1("Transpose", [w], name=f"{w}.T", perm=(1, 0))])
    return c.op("Add", [y, b]) if b else y


@op("addmm")
def _addmm(c, a):
    """beta == 0 drops ``self``: torch ignores it then, NaN and inf included (Gemm would give 0 * NaN)."""
    bias = [] if a["beta"] == 0 else [a["self"]]
    return c.op("Gemm", [a["mat1"], a["mat2"], *bias], alpha=a["alpha"], beta=a["beta"] if bias else 1.0)


op("mm", "bmm", "matmul")(lambda c, a: c.op("MatMul", [a["self"], a.get("mat2", a.get("other"))]))


@op("scaled_dot_product_attention")
def _sdpa(c, a):
    """The math form: softmax(q k^T * scale + mask) v, in MatMul/Softmax ops. Under a mask, a row whose
    scores are all -inf (fully masked) gives 0, as eager's ``_safe_softmax`` gives it, not NaN; without
    one (causal or not) no row is masked whole, and the guard's pass over the scores is left out."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if a["dropout_p"] > 0 or a["enable_gqa"]:
        raise Unsupported("dropout_p > 0" if a["dropout_p"] > 0 else "enable_gqa")
    rank, dt = c.rank(k), c.dtype(q)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(c.shape(q)[-1])
    s = c.op("MatMul", [q, c.op("Transpose", [k], perm=perm)])
    s = c.op("Mul", [s, c.const(scale, dt)])
    if a["is_causal"]:
        n, m = c.shape(s)[-2:]
        s = c.op("Where", [c.const(np.tril(np.ones((n, m), dtype=bool)), DType.BOOL), s, c.const(-math.inf, dt)])
    p = None
    if mask is not None:
        s = (c.op("Where", [mask, s, c.const(-math.inf, dt)]) if c.dtype(mask) is DType.BOOL
             else c.op("Add", c.promote(s, mask)))
        masked = c.op("Equal", [c.op("ReduceMax", [s], axes=[c.rank(s) - 1], keepdims=1), c.const(-math.inf, c.dtype(s))])
        p = c.op("Where", [masked, c.const(0, c.dtype(s)), c.op("Softmax", [s], axis=-1)])
    return c.op("MatMul", [p or c.op("Softmax", [s], axis=-1), v])


# --- convolution ------------------------------------------------------------------------------------
@op("convolution", "conv1d", "conv2d", "conv3d")
def _conv(c, a):
    if isinstance(a["padding"], str):
        raise Unsupported(f"padding={a['padding']!r}")
    n = c.rank(a["input"]) - 2
    pads = pair(a["padding"], n)
    inputs = [a["input"], a["weight"]] + ([a["bias"]] if a["bias"] else [])
    geometry = dict(strides=pair(a["stride"], n), pads=pads + pads, dilations=pair(a["dilation"], n), group=a["groups"])
    if a.get("transposed"):
        return c.op("ConvTranspose", inputs, output_padding=pair(a["output_padding"], n), **geometry)
    return c.op("Conv", inputs, **geometry)


# --- normalization ----------------------------------------------------------------------------------
@op("_native_batch_norm_legit_no_training", "native_batch_norm", "batch_norm", "_native_batch_norm_legit")
def _batch_norm(c, a):
    if a.get("training") or a.get("running_mean") is None:
        raise Unsupported("training-mode batch norm")
    y = _running_norm(c, a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"], a["eps"])
    return y if c.node.target.__name__.startswith("batch_norm") else (y, None, None)


def _running_norm(c, x: str, weight, bias, mean: str, var: str, eps: float) -> str:
    ch, dt = c.shape(x)[1], c.dtype(x)
    scale = weight or c.const(np.ones(ch), dt, hint="bn_scale")
    bias = bias or c.const(np.zeros(ch), dt, hint="bn_bias")
    return c.op("BatchNormalization", [x, scale, bias, mean, var], epsilon=eps)


@op("native_layer_norm", "layer_norm")
def _layer_norm(c, a):
    x, shape = a["input"], list(a["normalized_shape"])
    scale = a["weight"] or c.const(np.ones(shape), c.dtype(x), hint="ln_scale")
    inputs = [x, scale] + ([a["bias"]] if a["bias"] else [])
    y = c.op("LayerNormalization", inputs, axis=-len(shape), epsilon=a["eps"])
    return y if c.node.target.__name__.startswith("layer_norm") else (y, None, None)


def _composers(c) -> tuple:
    """The emitters :mod:`norm_compose` builds with."""
    return (lambda op_, inputs, suffix, **attrs: c.op(op_, inputs, **attrs),
            lambda op_, inputs, **attrs: c.op(op_, inputs, **attrs),
            lambda value, suffix: c.const(value, DType.from_numpy(value.dtype), hint=f"{c.node.name}_{suffix}"))


@op("native_group_norm", "group_norm")
def _group_norm(c, a):
    x = a["input"]
    shape = c.shape(x)
    groups = a["group"] if "group" in a else a["num_groups"]
    if len(shape) < 2 or not c.dtype(x).is_float:
        raise Unsupported(f"group norm of a rank-{len(shape)} {c.dtype(x).value} tensor")
    y = norm_compose.group_norm(*_composers(c), x, a["weight"], a["bias"], shape[0], groups, shape[1:],
                                c.dtype(x), a["eps"])
    return y if c.node.target.__name__.startswith("group_norm") else (y, None, None)


@op("instance_norm")
def _instance_norm(c, a):
    """Statistics of each sample's channel plane, or the running ones (``track_running_stats``)."""
    x, shape = a["input"], c.shape(a["input"])
    if not a["use_input_stats"]:
        return _running_norm(c, x, a["weight"], a["bias"], a["running_mean"], a["running_var"], a["eps"])
    if len(shape) < 3:
        raise Unsupported(f"instance norm of a rank-{len(shape)} tensor")
    return norm_compose.instance_norm(*_composers(c), x, a["weight"], a["bias"], shape, c.dtype(x), a["eps"])


# --- pooling ----------------------------------------------------------------------------------------
def _batched(fn: Translator, spatial: int = 2) -> Translator:
    """Unbatched (C, *spatial) input runs as a batch of one, as torch runs it."""
    def run(c, a):
        x = a["self"]
        if c.rank(x) != spatial + 1:
            return fn(c, a, x)
        y = fn(c, a, c.op("Unsqueeze", [x], axes=[0]))
        return tuple(v and c.op("Squeeze", [v], axes=[0]) for v in y) if isinstance(y, tuple) else \
            c.op("Squeeze", [y], axes=[0])
    return run


def _windows(c, x: str, a) -> dict:
    """Kernel, strides and pads; under ceil_mode a window larger than the padded input (torch's one
    clipped window) becomes the padded input's extent, with a stride that leaves it the only one."""
    k, pads = pair(a["kernel_size"]), pair(a["padding"])
    strides = pair(a["stride"]) if a["stride"] else list(k)
    dil = pair(a.get("dilation", 1))
    for i, n in enumerate(c.shape(x)[-2:]):
        extent = n + 2 * pads[i]
        if (k[i] - 1) * dil[i] + 1 > extent and a["ceil_mode"]:
            k[i], strides[i] = (extent - 1) // dil[i] + 1, max(strides[i], extent)
    return dict(kernel_shape=k, strides=strides, pads=pads + pads, ceil_mode=int(a["ceil_mode"]))


@op("max_pool2d_with_indices", "max_pool2d")
@_batched
def _max_pool(c, a, x):
    y = c.op("MaxPool", [x], dilations=pair(a["dilation"]), **_windows(c, x, a))
    return (y, None) if c.node.target.__name__.startswith("max_pool2d_with_indices") else y


@op("avg_pool2d")
@_batched
def _avg_pool(c, a, x):
    if a["divisor_override"] is not None:
        raise Unsupported("divisor_override")
    return c.op("AveragePool", [x], count_include_pad=int(a["count_include_pad"]), **_windows(c, x, a))


@op("adaptive_avg_pool2d", "_adaptive_avg_pool2d")
@_batched
def _adaptive_avg_pool(c, a, x):
    out = pair(a["output_size"])
    if out == [1, 1]:
        return c.op("GlobalAveragePool", [x])
    h, w = c.shape(x)[-2:]
    if h % out[0] or w % out[1]:
        raise Unsupported(f"output size {out} does not divide {h}x{w}")
    k = [h // out[0], w // out[1]]
    return c.op("AveragePool", [x], kernel_shape=k, strides=k, pads=[0, 0, 0, 0])


# --- upsampling -------------------------------------------------------------------------------------
UPSAMPLE = {  # ATen op -> Resize's mode and nearest rounding; linear and cubic ones take align_corners
    "upsample_nearest1d": ("nearest", "floor"), "upsample_nearest2d": ("nearest", "floor"),
    "upsample_nearest3d": ("nearest", "floor"), "_upsample_nearest_exact1d": ("nearest", "round_prefer_ceil"),
    "_upsample_nearest_exact2d": ("nearest", "round_prefer_ceil"),
    "_upsample_nearest_exact3d": ("nearest", "round_prefer_ceil"),
    "upsample_linear1d": ("linear", None), "upsample_bilinear2d": ("linear", None),
    "upsample_trilinear3d": ("linear", None), "upsample_bicubic2d": ("cubic", None),
}
_SCALE_KEYS = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}


@op(*UPSAMPLE)
def _upsample(c, a):
    """Resize: torch's nearest reads floor(o / scale) (``asymmetric``), nearest-exact, linear and cubic
    the half-pixel centres, align_corners the corners; a given scale factor is the coordinates' scale."""
    x = a.get("input", a.get("self"))
    mode, nearest = UPSAMPLE[c.node.target.__name__.split(".")[0]]
    coords = "align_corners" if a.get("align_corners") else "asymmetric" if nearest == "floor" else "half_pixel"
    shape, out = c.shape(x), c.out_shape
    given = a.get("scale_factors") or [a.get(k) for k in _SCALE_KEYS.get(len(shape) - 2, ())]
    factors = given
    if a.get("align_corners") or not factors or any(f is None for f in factors):
        factors = [o / n for o, n in zip(out[2:], shape[2:])]
    extra = {"nearest_mode": nearest} if nearest else {"cubic_coeff_a": -0.75} if mode == "cubic" else {}
    attrs = dict(sizes=list(out), scales=[1.0, 1.0, *map(float, factors)], mode=mode,
                 coordinate_transformation_mode=coords, **extra)
    if nearest:  # Resize's f64 o / scale can floor elsewhere than ATen's f32 o * (1 / scale): then gathers
        picks = [_aten_nearest(n, o, f, nearest != "floor") for n, o, f in zip(shape[2:], out[2:], given or [None] * 3)]
        full = get_op("Resize").normalize_attrs(attrs)
        taps = [resize_taps(full, 2 + k, n) for k, n in enumerate(shape[2:])]
        if any(not np.array_equal(p, np.arange(len(p)) if t is None else t.index[:, 0]) for p, t in zip(picks, taps)):
            for k, pick in enumerate(picks):
                if not np.array_equal(pick, np.arange(len(pick))):
                    x = c.op("Gather", [x, c.b.constant(pick, hint=f"{c.node.name}_pick{k}", dtype=DType.I64)], axis=2 + k)
            return x
    return c.op("Resize", [x], **attrs)


def _aten_nearest(n_in: int, n_out: int, factor: float | None, exact: bool) -> np.ndarray:
    """The input index ATen's nearest (``exact``: nearest-exact) upsampling reads for each output index:
    floorf((o [+ 0.5]) * scale) in f32, where scale is f32(1 / factor) for a given factor, else f32(n_in) / n_out."""
    if n_out == n_in:
        return np.arange(n_out)
    if n_out == 2 * n_in and not exact:
        return np.arange(n_out) >> 1
    scale = np.float32(1.0 / factor) if factor else np.float32(n_in) / np.float32(n_out)
    o = np.arange(n_out, dtype=np.float32) + np.float32(0.5 if exact else 0.0)
    return np.minimum(np.floor(o * scale).astype(np.int64), n_in - 1)
