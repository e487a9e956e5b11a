"""Op family: nn — convolution, pooling, normalisation, softmax (see docs/ir.md).

References compute in float64 and cast back to the input dtype. Sliding windows are read-only
strided views of one padded copy, so Conv is a single batched matmul (im2col) and a pool is a
single reduction over the window axes: fast enough to run whole CNNs through the interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import broadcast_shapes, norm_axis, per_input_element, same_dtype, times_output
from .registry import REQUIRED, AttrKind, AttrSpec, OpDef, register, require

I, F, INTS = AttrKind.INT, AttrKind.FLOAT, AttrKind.INTS
_GEOMETRY = {"strides": AttrSpec(INTS), "pads": AttrSpec(INTS), "dilations": AttrSpec(INTS)}
_FLAG = (0, 1)


# --- window geometry (shared by Conv and the pools) ------------------------------------------------
def _geometry(op: str, spatial: Sequence[int], kernel: Sequence[int], a) -> tuple[int, ...]:
    """Validate strides/pads/dilations against the spatial rank and return the output extent.

    ceil_mode follows ONNX Runtime and PyTorch: a window may run past the end padding, but the last
    window must start inside the input or the begin padding (ONNX's own shape inference omits that
    drop, ONNX Runtime applies it).
    """
    nd = len(spatial)
    strides, pads, dilations = a["strides"], a["pads"], a.get("dilations", (1,) * nd)
    require(len(kernel) == nd and len(strides) == nd and len(dilations) == nd and len(pads) == 2 * nd,
            f"{op}: {nd} spatial dims need {nd} kernel dims, strides and dilations and {2 * nd} pads, got "
            f"kernel {list(kernel)}, strides {list(strides)}, dilations {list(dilations)}, pads {list(pads)}")
    require(all(k >= 1 for k in kernel), f"{op}: kernel {list(kernel)} has an empty dimension")
    require(all(s >= 1 for s in strides) and all(d >= 1 for d in dilations),
            f"{op}: strides {list(strides)} and dilations {list(dilations)} must be >= 1")
    require(all(p >= 0 for p in pads), f"{op}: pads {list(pads)} must be >= 0")
    ceil = a.get("ceil_mode", 0)
    require(ceil in _FLAG, f"{op}: ceil_mode must be 0 or 1, got {ceil}")
    out = []
    for i, n in enumerate(spatial):
        span = n + pads[i] + pads[nd + i] - (kernel[i] - 1) * dilations[i] - 1
        require(span >= 0, f"{op}: window {(kernel[i] - 1) * dilations[i] + 1} does not fit spatial dim {i} "
                           f"of size {n} with pads {pads[i]}+{pads[nd + i]}")
        o = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        if ceil and (o - 1) * strides[i] >= n + pads[i]:
            o -= 1
        out.append(o)
    return tuple(out)


def _windows(x: np.ndarray, kernel, a, out, value: float) -> np.ndarray:
    """Read-only view (N, C, *kernel, *out) of ``x``'s windows, over a copy padded with ``value``.

    The end padding also covers the ceil_mode overhang, so every window lies in bounds.
    """
    nd = len(kernel)
    strides, pads, dilations = a["strides"], a["pads"], a.get("dilations", (1,) * nd)
    widths = [(0, 0), (0, 0)]
    for i in range(nd):
        reach = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        widths.append((pads[i], max(pads[nd + i], reach - x.shape[2 + i] - pads[i])))
    xp = np.pad(x, widths, constant_values=value)
    sp = xp.strides[2:]
    shape = xp.shape[:2] + tuple(kernel) + tuple(out)
    steps = xp.strides[:2] + tuple(s * d for s, d in zip(sp, dilations)) + tuple(s * t for s, t in zip(sp, strides))
    return as_strided(xp, shape, steps, writeable=False)


def _channels_like(v: np.ndarray, rank: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast over (N, C, *spatial)."""
    return v.reshape((1, -1) + (1,) * (rank - 2))


# --- Conv ------------------------------------------------------------------------------------------
def _conv_infer(ts, a):
    x, w = ts[0], ts[1]
    same_dtype("Conv", ts)
    require(x.rank >= 3 and w.rank == x.rank, f"Conv: X {x} and W {w} must both be (N, C, *spatial), rank >= 3")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    g = a["group"]
    require(g >= 1 and c % g == 0 and m % g == 0, f"Conv: group {g} must divide X channels {c} and W filters {m}")
    require(cg == c // g, f"Conv: W {w} expects {cg * g} input channels in {g} group(s), X {x} has {c}")
    require(len(ts) < 3 or ts[2].shape == (m,), f"Conv: bias must be [{m}], got {ts[-1]}")
    out = _geometry("Conv", x.shape[2:], w.shape[2:], a)
    return [TensorType(x.dtype, (n, m) + out)]


def _conv(xs, a):
    """im2col: one (Cg*K, P) column matrix per (batch, group), one batched matmul with W."""
    x, w = xs[0], xs[1]
    n, c = x.shape[:2]
    m, kernel, g = w.shape[0], w.shape[2:], a["group"]
    out = _geometry("Conv", x.shape[2:], kernel, a)
    k, p = math.prod(kernel), math.prod(out)  # explicit sizes: a -1 is ambiguous in an empty reshape
    cols = _windows(x.astype(np.float64), kernel, a, out, 0.0).reshape(n, g, (c // g) * k, p)
    y = np.matmul(w.astype(np.float64).reshape(g, m // g, (c // g) * k), cols).reshape((n, m) + out)
    if len(xs) == 3:
        y += _channels_like(xs[2].astype(np.float64), y.ndim)
    return [y.astype(x.dtype)]


# --- pools -----------------------------------------------------------------------------------------
_MAXPOOL_DTYPES = {DType.F16, DType.F32, DType.F64, DType.I8, DType.U8}


def _pool_infer(op: str, dtypes=None):
    """``dtypes``: the dtypes the pool takes, where it is not float-only."""

    def infer(ts, a):
        x = ts[0]
        require(dtypes is None or x.dtype in dtypes, f"{op}: dtype {x.dtype.value} not supported")
        require(x.rank >= 3, f"{op}: X {x} must be (N, C, *spatial)")
        kernel, pads = a["kernel_shape"], a["pads"]
        require(a.get("count_include_pad", 0) in _FLAG, f"{op}: count_include_pad must be 0 or 1")
        out = _geometry(op, x.shape[2:], kernel, a)
        # ONNX Runtime rejects these too; they would allow windows made only of padding.
        require(all(p < kernel[i % len(kernel)] for i, p in enumerate(pads)),
                f"{op}: pads {list(pads)} must be smaller than kernel_shape {list(kernel)}")
        return [TensorType(x.dtype, tuple(x.shape[:2]) + out)]

    return infer


def _lowest(dtype: np.dtype) -> float:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _max_pool(xs, a):
    """Padding (and the ceil overhang) holds the dtype's lowest value, so it never wins.

    A dilated window that sees only padding gives -inf, as PyTorch does (ONNX Runtime: -FLT_MAX).
    """
    x, kernel = xs[0], a["kernel_shape"]
    out = _geometry("MaxPool", x.shape[2:], kernel, a)
    win = _windows(x, kernel, a, out, _lowest(x.dtype))
    return [win.max(axis=tuple(range(2, 2 + len(kernel))))]


def _avg_divisor(spatial, kernel, a, out) -> np.ndarray:
    """Elements counted per window: the product of per-axis counts over the counted region.

    That region is the input, or (count_include_pad) the input plus its explicit pads, never the
    ceil_mode overhang past the end padding (as ONNX Runtime and PyTorch do).
    """
    nd, strides, pads = len(spatial), a["strides"], a["pads"]
    div = np.ones(())
    for i, n in enumerate(spatial):
        lo, hi = (-pads[i], n + pads[nd + i]) if a["count_include_pad"] else (0, n)
        starts = np.arange(out[i]) * strides[i] - pads[i]
        div = np.multiply.outer(div, np.minimum(starts + kernel[i], hi) - np.maximum(starts, lo))
    return div


def _avg_pool(xs, a):
    x, kernel = xs[0], a["kernel_shape"]
    out = _geometry("AveragePool", x.shape[2:], kernel, a)
    total = _windows(x.astype(np.float64), kernel, a, out, 0.0).sum(axis=tuple(range(2, 2 + len(kernel))))
    return [(total / _avg_divisor(x.shape[2:], kernel, a, out)).astype(x.dtype)]


def _global_avg_infer(ts, a):
    x = ts[0]
    require(x.rank >= 3, f"GlobalAveragePool: X {x} must be (N, C, *spatial)")
    return [TensorType(x.dtype, tuple(x.shape[:2]) + (1,) * (x.rank - 2))]


def _global_avg(xs, a):
    x = xs[0]
    return [x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)]


# --- normalisation ---------------------------------------------------------------------------------
def _batch_norm_infer(ts, a):
    x = ts[0]
    same_dtype("BatchNormalization", ts)
    require(x.rank >= 2, f"BatchNormalization: X {x} must be (N, C, ...)")
    for t, what in zip(ts[1:], ("scale", "B", "mean", "var")):
        require(t.shape == (x.shape[1],), f"BatchNormalization: {what} must be [{x.shape[1]}], got {t}")
    return [x]


def _batch_norm(xs, a):
    """Inference form: running statistics, folded into one scale and one shift per channel."""
    x, scale, bias, mean, var = (v.astype(np.float64) for v in xs)
    inv = scale / np.sqrt(var + a["epsilon"])
    y = x * _channels_like(inv, x.ndim) + _channels_like(bias - mean * inv, x.ndim)
    return [y.astype(xs[0].dtype)]


def _lrn_infer(ts, a):
    x = ts[0]
    require(x.rank >= 3, f"LRN: X {x} must be (N, C, *spatial)")
    require(a["size"] >= 1, f"LRN: size must be >= 1, got {a['size']}")
    return [x]


def _lrn(xs, a):
    """Sum of squares over channels c - floor((size-1)/2) .. c + ceil((size-1)/2), clipped to [0, C)."""
    x = xs[0].astype(np.float64)
    size, c = a["size"], x.shape[1]
    before = (size - 1) // 2
    sq = np.pad(x * x, [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.ndim - 2))
    ssum = sum(sq[:, j:j + c] for j in range(size))
    y = x / (a["bias"] + a["alpha"] / size * ssum) ** a["beta"]
    return [y.astype(xs[0].dtype)]


def _layer_norm_infer(ts, a):
    x = ts[0]
    same_dtype("LayerNormalization", ts)
    axis = norm_axis("LayerNormalization", a["axis"], x.rank)
    normed = tuple(x.shape[axis:])
    for t in ts[1:]:
        require(t.rank <= len(normed) and broadcast_shapes("LayerNormalization", normed, t.shape) == normed,
                f"LayerNormalization: {t} does not broadcast to the normalized shape {list(normed)}")
    return [x]


def _layer_norm(xs, a):
    x = xs[0].astype(np.float64)
    axes = tuple(range(norm_axis("LayerNormalization", a["axis"], x.ndim), x.ndim))
    centered = x - x.mean(axis=axes, keepdims=True)
    y = centered / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + a["epsilon"])
    y = y * xs[1].astype(np.float64)
    if len(xs) == 3:
        y = y + xs[2].astype(np.float64)
    return [y.astype(xs[0].dtype)]


# --- softmax ---------------------------------------------------------------------------------------
def _softmax_infer(op: str):
    def infer(ts, a):
        norm_axis(op, a["axis"], ts[0].rank)
        return [ts[0]]

    return infer


def _half_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """f16 as ONNX's reference computes it: each step rounded to half (the shifted values, their
    exponentials, their sum, the quotient), the arithmetic itself in f32."""
    def r(v):
        return v.astype(np.float16).astype(np.float32)

    x32 = x.astype(np.float32)
    e = r(np.exp(r(x32 - x32.max(axis=axis, keepdims=True, initial=-np.inf))))
    return (e / r(e.sum(axis=axis, keepdims=True))).astype(np.float16)


def _softmax(log: bool):
    """Shifted by the maximum along the axis, so large inputs cannot overflow exp."""

    def ref(xs, a):
        x = xs[0].astype(np.float64)
        axis = norm_axis("Softmax", a["axis"], x.ndim)
        if xs[0].dtype == np.float16 and not log:
            return [_half_softmax(xs[0], axis)]
        z = x - x.max(axis=axis, keepdims=True, initial=-np.inf)  # initial: an empty axis is no error
        total = np.exp(z).sum(axis=axis, keepdims=True)
        y = z - np.log(total) if log else np.exp(z) / total
        return [y.astype(xs[0].dtype)]

    return ref


# --- FLOP rules (multiply-add = 2) ----------------------------------------------------------------
def conv_flops(a, ins, outs) -> int:
    """One output element takes prod(W.shape[1:]) multiply-adds (W is [M, C/group, *kernel])."""
    return 2 * math.prod(outs[0].shape) * math.prod(ins[1].shape[1:])


def _conv_flops(a, ins, outs) -> int:
    return conv_flops(a, ins, outs) + (math.prod(outs[0].shape) if len(ins) > 2 else 0)


def _pool_flops(a, ins, outs) -> int:
    return math.prod(outs[0].shape) * math.prod(a.get("kernel_shape", ()) or (1,))


register(
    OpDef("Conv", _conv_infer, _conv, attrs={**_GEOMETRY, "group": AttrSpec(I, 1)}, min_inputs=2, max_inputs=3,
          doc="N-d convolution; W is (M, C/group, *kernel); pads are begins then ends", float_only=True,
          flops=_conv_flops),
    OpDef("BatchNormalization", _batch_norm_infer, _batch_norm, attrs={"epsilon": AttrSpec(F, 1e-5)},
          min_inputs=5, max_inputs=5, doc="inference only: X, scale, B, mean, var", float_only=True,
          inplace=lambda a, i: i == 0, flops=times_output(2)),  # y[i] from x[i] and per-channel constants
    OpDef("MaxPool", _pool_infer("MaxPool", _MAXPOOL_DTYPES), _max_pool,
          attrs={**_GEOMETRY, "kernel_shape": AttrSpec(INTS), "ceil_mode": AttrSpec(I, 0)}, flops=_pool_flops),
    OpDef("AveragePool", _pool_infer("AveragePool"), _avg_pool,
          attrs={"kernel_shape": AttrSpec(INTS), "strides": AttrSpec(INTS), "pads": AttrSpec(INTS),
                 "ceil_mode": AttrSpec(I, 0), "count_include_pad": AttrSpec(I, 0)}, float_only=True, flops=_pool_flops),
    OpDef("GlobalAveragePool", _global_avg_infer, _global_avg, float_only=True, flops=per_input_element,
          same_as_onnx=True),
    OpDef("LRN", _lrn_infer, _lrn, attrs={"size": AttrSpec(I, REQUIRED), "alpha": AttrSpec(F, 1e-4),
                                          "beta": AttrSpec(F, 0.75), "bias": AttrSpec(F, 1.0)},
          float_only=True, flops=times_output(5), same_as_onnx=True),
    OpDef("Softmax", _softmax_infer("Softmax"), _softmax(log=False), attrs={"axis": AttrSpec(I, -1)}, float_only=True,
          flops=times_output(3)),
    OpDef("LogSoftmax", _softmax_infer("LogSoftmax"), _softmax(log=True), attrs={"axis": AttrSpec(I, -1)},
          float_only=True, flops=times_output(3)),
    OpDef("LayerNormalization", _layer_norm_infer, _layer_norm,
          attrs={"axis": AttrSpec(I, -1), "epsilon": AttrSpec(F, 1e-5)}, min_inputs=2, max_inputs=3, float_only=True,
          flops=times_output(5)),
)
