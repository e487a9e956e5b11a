"""Op family: resample — ConvTranspose, Resize and GridSample, the ops that grow a spatial output (see docs/ir.md).

Resize is separable: along each resized axis an output position reads a few input positions with
weights (:func:`resize_taps`, ONNX's own rule for every mode and coordinate transformation). The
reference applies the taps axis by axis in float64; the kernels read the same tables, so only the
order of the additions differs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import same_dtype
from .registry import AttrKind, AttrSpec, OpDef, register, require

I, F, S, INTS, FLOATS = AttrKind.INT, AttrKind.FLOAT, AttrKind.STRING, AttrKind.INTS, AttrKind.FLOATS


# --- ConvTranspose ---------------------------------------------------------------------------------
def _convt_geometry(x: TensorType, w: TensorType, a) -> tuple[int, ...]:
    nd = x.rank - 2
    k = w.shape[2:]
    strides, dil, pads, extra = a["strides"], a["dilations"], a["pads"], a["output_padding"]
    require(len(strides) == nd and len(dil) == nd and len(pads) == 2 * nd and len(extra) == nd,
            f"ConvTranspose: {nd} spatial dims need {nd} strides, dilations, output_padding and {2 * nd} pads")
    require(all(s >= 1 for s in strides) and all(d >= 1 for d in dil) and all(p >= 0 for p in (*pads, *extra)),
            "ConvTranspose: strides and dilations must be >= 1, pads and output_padding >= 0")
    require(all(n >= 1 for n in x.shape[2:]), f"ConvTranspose: X {x} needs non-empty spatial dims (its output "
                                              "size counts from the last input position)")
    out = tuple(s * (n - 1) + e + (kk - 1) * d + 1 - pb - pe
                for n, kk, s, d, e, pb, pe in zip(x.shape[2:], k, strides, dil, extra, pads[:nd], pads[nd:]))
    require(all(o >= 0 for o in out), f"ConvTranspose: pads {list(pads)} crop more than the output {list(out)}")
    return out


def _convt_infer(ts, a):
    x, w = ts[0], ts[1]
    same_dtype("ConvTranspose", ts)
    require(x.rank >= 3 and w.rank == x.rank, f"ConvTranspose: X {x} and W {w} must both be (N, C, *spatial)")
    g = a["group"]
    c, m = x.shape[1], w.shape[1] * g
    require(g >= 1 and w.shape[0] == c and c % g == 0, f"ConvTranspose: W {w} must be (C={c}, M/group, *kernel)")
    require(len(ts) < 3 or ts[2].shape == (m,), f"ConvTranspose: bias must be [{m}], got {ts[-1]}")
    return [TensorType(x.dtype, (x.shape[0], m) + _convt_geometry(x, w, a))]


def _conv_transpose(xs, a):
    """Every input element scatters W's taps: one product per tap, added at stride-spaced positions
    of an uncropped output, then the pads are cropped off."""
    x, w = xs[0].astype(np.float64), xs[1].astype(np.float64)
    n, c, *spatial = x.shape
    g, k = a["group"], w.shape[2:]
    nd, mg = len(spatial), w.shape[1]
    strides, dil, pads, extra = a["strides"], a["dilations"], a["pads"], a["output_padding"]
    full = [s * (i - 1) + e + (kk - 1) * d + 1 for i, kk, s, d, e in zip(spatial, k, strides, dil, extra)]
    y = np.zeros((n, g, mg, *full))
    xg = x.reshape(n, g, c // g, *spatial)
    wg = w.reshape(g, c // g, mg, *k)
    for tap in np.ndindex(*k):
        part = np.einsum("ngc...,gcm->ngm...", xg, wg[(slice(None), slice(None), slice(None), *tap)])
        where = tuple(slice(t * d, t * d + (i - 1) * s + 1, s) for t, d, i, s in zip(tap, dil, spatial, strides))
        y[(slice(None),) * 3 + where] += part
    y = y.reshape(n, g * mg, *full)
    out = _convt_geometry(TensorType(DType.F64, x.shape), TensorType(DType.F64, w.shape), a)
    y = y[(slice(None), slice(None), *(slice(p, p + o) for p, o in zip(pads[:nd], out)))]
    if len(xs) == 3:
        y = y + xs[2].astype(np.float64).reshape((1, -1) + (1,) * nd)
    return [y.astype(xs[0].dtype)]


def _convt_flops(a, ins, outs) -> int:
    return 2 * math.prod(ins[0].shape) * math.prod(ins[1].shape[1:])


# --- Resize ----------------------------------------------------------------------------------------
MODES = ("nearest", "linear", "cubic")
COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
               "half_pixel_symmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class Taps:
    """Along one axis: output position o reads input ``index[o, j]`` with weight ``weight[o, j]``;
    ``outside[o]`` (tf_crop_and_resize) gives the extrapolation value instead."""

    index: np.ndarray  # (out, n) int64, inside [0, in)
    weight: np.ndarray  # (out, n) float64
    outside: np.ndarray  # (out,) bool


def _source(mode: str, y: np.ndarray, scale: float, n_in: int, n_out: int, roi: tuple[float, float]) -> np.ndarray:
    """The input coordinate of each output position (ONNX's coordinate_transformation_mode)."""
    width = scale * n_in
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if width == 1 else y * (hi - lo) * (n_in - 1) / (width - 1)
        return x + lo * (n_in - 1)
    if mode == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    offset = n_in / 2 * (1 - n_out / width)  # half_pixel_symmetric
    return offset + (y + 0.5) / scale - 0.5


def _coeffs(a, ratio: float, scale: float) -> np.ndarray:
    mode, cubic = a["mode"], a["cubic_coeff_a"]
    if mode == "nearest":
        if ratio == 1 or ratio == int(ratio):
            return np.array([0.0, 1.0])
        pick = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}
        up = pick[a["nearest_mode"]]
        return np.array([0.0 if up else 1.0, 1.0 if up else 0.0])
    if a["antialias"]:
        s = min(scale, 1.0)
        if mode == "linear":
            start = int(np.floor(-1 / s) + 1)
            c = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
        else:
            start = int(np.floor(-2 / s) + 1)
            t = np.abs(s * (np.arange(start, 2 - start) - ratio))
            c = np.where(t <= 1, (cubic + 2) * t**3 - (cubic + 3) * t**2 + 1,
                         np.where(t < 2, cubic * t**3 - 5 * cubic * t**2 + 8 * cubic * t - 4 * cubic, 0.0))
        return c / c.sum()
    if mode == "linear":
        return np.array([1 - ratio, ratio])
    r, A = ratio, cubic
    return np.array([((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
                     ((A + 2) * r - (A + 3)) * r * r + 1,
                     ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
                     ((A * (2 - r) - 5 * A) * (2 - r) + 8 * A) * (2 - r) - 4 * A])


def _roi(a, axis: int) -> tuple[float, ...]:
    return tuple(a["roi"][axis::len(a["scales"])]) if a["roi"] else (0.0, 1.0)


def _resized(a, axis: int, n_in: int) -> bool:
    """Does the axis need taps (any change of size, scale or region of interest)?"""
    return not (a["sizes"][axis] == n_in and math.isclose(a["scales"][axis], 1.0) and (
        a["coordinate_transformation_mode"] != "tf_crop_and_resize" or _roi(a, axis) == (0.0, 1.0)))


def resize_taps(a, axis: int, n_in: int) -> Taps | None:
    """The taps of one axis, or None where the axis is not resized."""
    n_out, scale, roi = a["sizes"][axis], a["scales"][axis], _roi(a, axis)
    if not _resized(a, axis, n_in):
        return None
    x = _source(a["coordinate_transformation_mode"], np.arange(n_out, dtype=np.float64), scale, n_in, n_out, roi)
    base = np.floor(x)
    ratios = np.where(x == base, 1.0, x - base)
    weight = np.array([_coeffs(a, float(r), scale) for r in ratios]).reshape(n_out, -1)
    n = weight.shape[1]
    pad = math.ceil(n / 2)
    p = np.floor(x + pad)
    frac = x + pad - p
    if n % 2 == 0:
        start = p + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        start = p + np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    index = start.astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if a["exclude_outside"]:
        weight = np.where((index < 0) | (index >= n_in), 0.0, weight)
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    outside = (x < 0) | (x > n_in - 1) if a["coordinate_transformation_mode"] == "tf_crop_and_resize" \
        else np.zeros(n_out, bool)
    index = np.clip(index, 0, max(n_in - 1, 0))
    picks = (weight == 1.0) & (weight.sum(axis=1, keepdims=True) == 1.0)
    if n_out and picks.any(axis=1).all():  # one weight of 1 per row (nearest): a plain gather
        return Taps(index[np.arange(n_out), picks.argmax(axis=1)][:, None], np.ones((n_out, 1)), outside)
    return Taps(index, weight, outside)


def _resize_infer(ts, a):
    x = ts[0]
    rank = x.rank
    require(a["mode"] in MODES, f"Resize: mode must be one of {', '.join(MODES)}, got {a['mode']!r}")
    require(a["coordinate_transformation_mode"] in COORDINATES,
            f"Resize: unknown coordinate_transformation_mode {a['coordinate_transformation_mode']!r}")
    require(a["nearest_mode"] in NEAREST, f"Resize: unknown nearest_mode {a['nearest_mode']!r}")
    require(len(a["sizes"]) == rank and len(a["scales"]) == rank, f"Resize: sizes and scales need {rank} values each")
    require(len(a["roi"]) in (0, 2 * rank), f"Resize: roi needs {2 * rank} values or none")
    require(all(s > 0 and math.isfinite(s) for s in a["scales"]), f"Resize: scales {list(a['scales'])} must be > 0")
    require(a["antialias"] in (0, 1) and a["exclude_outside"] in (0, 1), "Resize: antialias and exclude_outside are 0 or 1")
    require(a["mode"] == "nearest" or x.dtype.is_float, f"Resize: {a['mode']} mode needs floats, got {x.dtype.value}")
    require(x.dtype.is_float or not math.isnan(a["extrapolation_value"]),
            "Resize: an integer tensor's extrapolation_value must be a number, got NaN")
    sizes = tuple(n if s < 0 else s for n, s in zip(x.shape, a["sizes"]))
    full = {**a, "sizes": sizes}
    require(all(n > 0 and m > 0 for axis, (n, m) in enumerate(zip(x.shape, sizes)) if _resized(full, axis, n)),
            f"Resize: an axis resized from {list(x.shape)} to {list(sizes)} must be non-empty on both sides")
    return [TensorType(x.dtype, sizes)]


def resize_attrs(a, shape: Sequence[int]):
    """``a`` with the sizes of every axis filled in (-1: the input's own)."""
    return {**a, "sizes": tuple(n if s < 0 else s for n, s in zip(shape, a["sizes"]))}


def integer_fill(value: float, dtype: np.dtype) -> int:
    """An integer (or bool) Resize's extrapolation value: rounded to nearest even and saturated to
    ``dtype`` (in Python integers: iinfo(int64).max is not a float64)."""
    lo, hi = (0, 1) if dtype == np.bool_ else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    return int(min(max(np.rint(value), lo), hi)) if np.isfinite(value) else (hi if value > 0 else lo)


def _resize(xs, a):
    """Floats sum their taps in float64; integers (nearest mode: weights 0 or 1) in their own type,
    so every value is copied exactly."""
    x = xs[0]
    a = resize_attrs(a, x.shape)
    exact = x.dtype.kind != "f"
    y = x if exact else x.astype(np.float64)
    fill = integer_fill(a["extrapolation_value"], x.dtype) if exact else a["extrapolation_value"]
    for axis, n_in in enumerate(x.shape):
        taps = resize_taps(a, axis, n_in)
        if taps is None:
            continue
        shape = (1,) * axis + taps.weight.shape + (1,) * (y.ndim - axis - 1)
        y = (np.take(y, taps.index.reshape(-1), axis=axis).reshape(y.shape[:axis] + taps.index.shape + y.shape[axis + 1:])
             * taps.weight.astype(y.dtype).reshape(shape)).sum(axis=axis + 1, dtype=y.dtype)
        if taps.outside.any():
            mask = taps.outside.reshape((1,) * axis + (-1,) + (1,) * (y.ndim - axis - 1))
            y = np.where(mask, np.asarray(fill, dtype=y.dtype), y)
    return [y.astype(x.dtype)]


# --- GridSample ------------------------------------------------------------------------------------
GRID_MODES = ("nearest", "linear", "cubic")
GRID_PADDING = ("zeros", "border", "reflection")


def _grid_infer(ts, a):
    x, grid = ts
    r = x.rank - 2
    require(r >= 1 and grid.rank == r + 2 and grid.shape[0] == x.shape[0] and grid.shape[-1] == r,
            f"GridSample: X {x} and grid {grid} must be (N, C, *spatial) and (N, *out, {max(r, 0)})")
    require(grid.dtype.is_float, f"GridSample: grid must be a float tensor, got {grid.dtype.value}")
    require(a["mode"] in GRID_MODES and a["padding_mode"] in GRID_PADDING and a["align_corners"] in (0, 1),
            f"GridSample: mode {a['mode']!r} or padding_mode {a['padding_mode']!r} unknown, or align_corners not 0/1")
    require(a["mode"] != "cubic" or r == 2, "GridSample: cubic mode samples 2-D images only")
    require(all(n >= 1 for n in x.shape[2:]), f"GridSample: X {x} needs non-empty spatial dims")
    return [TensorType(x.dtype, x.shape[:2] + grid.shape[1:-1])]


def grid_border(n: int, align_corners: int) -> tuple[float, float]:
    """The coordinate range of an axis of ``n`` pixels; reflection mirrors at its ends."""
    return (0.0, n - 1.0) if align_corners else (-0.5, n - 0.5)


def grid_reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Mirror ``x`` at ``lo`` and ``hi`` until it lies between them (ONNX's rule, as PyTorch's)."""
    span = hi - lo
    if span == 0:
        return np.full_like(x, lo)
    below, d = x < lo, np.where(x < lo, lo - x, x - hi)
    k = np.trunc(d / span)
    r = d - k * span
    even = np.mod(k, 2) == 0
    return np.where((x >= lo) & (x <= hi), x, np.where(below == even, lo + r, hi - r))


def cubic_weights(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for a fraction ``t``."""
    return [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


def _grid_axis(a, g: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(inside, index, weight) of each tap along one axis for normalized coordinates ``g``."""
    lo, hi = grid_border(n, a["align_corners"])
    x = (g + 1) / 2 * (n - 1) if a["align_corners"] else ((g + 1) * n - 1) / 2
    if a["mode"] == "nearest":
        x = np.rint(x)
    # cubic clamps each tap, not the coordinate, as ONNX Runtime and PyTorch do (ONNX's reference
    # clamps the coordinate first; no conformance case tells them apart)
    if a["padding_mode"] == "border" and a["mode"] != "cubic":
        x = np.where((x < lo) | (x > hi), np.clip(x, 0, n - 1), x)
    elif a["padding_mode"] == "reflection":
        x = grid_reflect(x, lo, hi)
    x = np.clip(np.nan_to_num(x, nan=-8.0), -8.0, n + 8.0)  # far outside stays outside; NaN is outside
    if a["mode"] == "nearest":
        taps = [(np.trunc(x), np.ones_like(x))]
    else:
        f = np.floor(x)
        t = x - f
        weights = [1 - t, t] if a["mode"] == "linear" else cubic_weights(t)
        first = 0 if a["mode"] == "linear" else -1
        taps = [(f + first + k, w) for k, w in enumerate(weights)]
    out = []
    for i, w in taps:
        if a["padding_mode"] == "border":
            i = np.clip(i, 0, n - 1)
        elif a["padding_mode"] == "reflection":
            i = np.trunc(grid_reflect(i, lo, hi))
        inside = (i >= 0) & (i < n)
        out.append((inside, np.clip(i, 0, n - 1).astype(np.int64), w))
    return out


def _grid_sample(xs, a):
    """Each output position reads the product of its axes' taps, in float64 (ONNX's reference
    loops over positions; this is the same arithmetic per axis)."""
    x, grid = xs[0].astype(np.float64), xs[1].astype(np.float64)
    spatial = x.shape[2:]
    r = len(spatial)
    with np.errstate(invalid="ignore", over="ignore"):  # infinities reflect to NaN, which is outside
        per_axis = [_grid_axis(a, grid[..., r - 1 - d], spatial[d]) for d in range(r)]
    xt = np.moveaxis(x, 1, -1)  # (N, *spatial, C)
    nidx = np.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
    y = np.zeros(grid.shape[:-1] + (x.shape[1],))
    for combo in itertools.product(*per_axis):
        inside = np.logical_and.reduce([c[0] for c in combo])[..., None]
        weight = np.prod([c[2] for c in combo], axis=0)[..., None]
        y += np.where(inside, xt[(nidx, *(c[1] for c in combo))] * weight, 0.0)
    return [np.moveaxis(y, -1, 1).astype(xs[0].dtype)]


def _grid_flops(a, ins, outs) -> int:
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[a["mode"]] ** (ins[0].rank - 2)
    return 2 * taps * math.prod(outs[0].shape)


register(
    OpDef("ConvTranspose", _convt_infer, _conv_transpose,
          attrs={"strides": AttrSpec(INTS), "pads": AttrSpec(INTS), "dilations": AttrSpec(INTS),
                 "output_padding": AttrSpec(INTS), "group": AttrSpec(I, 1)},
          min_inputs=2, max_inputs=3, float_only=True, flops=_convt_flops,
          doc="transposed N-d convolution; W is (C, M/group, *kernel); pads are begins then ends"),
    OpDef("Resize", _resize_infer, _resize,
          attrs={"sizes": AttrSpec(INTS), "scales": AttrSpec(FLOATS), "roi": AttrSpec(FLOATS, ()),
                 "mode": AttrSpec(S, "nearest"), "coordinate_transformation_mode": AttrSpec(S, "half_pixel"),
                 "nearest_mode": AttrSpec(S, "round_prefer_floor"), "cubic_coeff_a": AttrSpec(F, -0.75),
                 "exclude_outside": AttrSpec(I, 0), "extrapolation_value": AttrSpec(F, 0.0),
                 "antialias": AttrSpec(I, 0)},
          doc="ONNX Resize with sizes (-1: unchanged) and scales resolved per axis"),
    OpDef("GridSample", _grid_infer, _grid_sample,
          attrs={"mode": AttrSpec(S, "linear"), "padding_mode": AttrSpec(S, "zeros"), "align_corners": AttrSpec(I, 0)},
          min_inputs=2, max_inputs=2, float_only=True, flops=_grid_flops,
          doc="X sampled at grid's normalized coordinates (last axis reversed: x, y[, z]); ONNX GridSample 20"),
)
