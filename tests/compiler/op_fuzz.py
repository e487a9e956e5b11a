"""A native-vs-reference op fuzzer: random single-op cases (random ranks, dims with zeros, attributes,
dtypes), many per compiled graph, each compared with the reference interpreter.

A generator proposes a case; the op's shape rule decides whether the verifier admits it (a refused
case is skipped, never a finding). For an admitted case the fuzzer checks that the reference's
output has the inferred type, and that the native code computes the reference's values (NaN where
it has NaN), or refuses at run time where the reference refuses. Used by ``test_op_fuzz.py`` with a
seeded budget, and as a script (``python -m tests.compiler.op_fuzz --cases 5000``) for long hunts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, run_reference
from cuvil.compiler.errors import CuvilError

Rng = np.random.Generator


@dataclass
class Case:
    op: str
    operands: list[tuple[str, np.ndarray, bool]]  # (role, value, is_constant), in input order
    attrs: dict = field(default_factory=dict)
    outputs: int = 1

    def describe(self) -> str:
        ins = ", ".join(f"{'const ' if c else ''}{a.dtype}{list(a.shape)}" for _, a, c in self.operands)
        return f"{self.op}({ins}) {self.attrs}"


# --- value and shape helpers -----------------------------------------------------------------------
FLOATS = (np.float32,) * 6 + (np.float64, np.float16)
NUMBERS = FLOATS + (np.int32, np.int64, np.int8, np.uint8)
ANY = NUMBERS + (np.bool_,)


def dim(rng: Rng, hi: int = 5) -> int:
    return 0 if rng.random() < 0.12 else int(rng.integers(1, hi + 1))


def shape(rng: Rng, lo: int = 0, hi: int = 4, dhi: int = 5) -> tuple[int, ...]:
    return tuple(dim(rng, dhi) for _ in range(int(rng.integers(lo, hi + 1))))


def values(rng: Rng, shp, dtype, specials: bool = True) -> np.ndarray:
    """Random values; floats get an infinity, NaN or signed zero now and then unless ``specials`` is off."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shp) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -6
        return rng.integers(lo, 7, shp).astype(dtype)
    x = rng.standard_normal(shp) * 2.0
    if specials and rng.random() < 0.1 and x.size:
        x.flat[rng.integers(0, x.size)] = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0])
    return x.astype(dtype)


def broadcastable(rng: Rng, out: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``out``: leading axes dropped, some axes set to 1."""
    keep = out[int(rng.integers(0, len(out) + 1)):] if out and rng.random() < 0.4 else out
    return tuple(1 if rng.random() < 0.3 else d for d in keep)


def pick(rng: Rng, options):
    return options[int(rng.integers(0, len(options)))]


def x(rng: Rng, dtypes=FLOATS, lo: int = 0, hi: int = 4) -> tuple[str, np.ndarray, bool]:
    return ("x", values(rng, shape(rng, lo, hi), pick(rng, dtypes)), False)


def operand(value: np.ndarray, rng: Rng, const_p: float = 0.3) -> tuple[str, np.ndarray, bool]:
    return ("in", value, bool(rng.random() < const_p))


# --- generators, one per op family -----------------------------------------------------------------
def unary(op: str, dtypes=FLOATS, **attr_gens) -> Callable[[Rng], Case]:
    return lambda rng: Case(op, [x(rng, dtypes)], {k: g(rng) for k, g in attr_gens.items()})


def binary(op: str, dtypes=NUMBERS) -> Callable[[Rng], Case]:
    def gen(rng: Rng) -> Case:
        out, dt = shape(rng), pick(rng, dtypes)
        a, b = (values(rng, broadcastable(rng, out), dt) for _ in range(2))
        if rng.random() < 0.5:
            a, b = b, a
        return Case(op, [operand(a, rng, 0.1), operand(b, rng)])
    return gen


def variadic(op: str) -> Callable[[Rng], Case]:
    def gen(rng: Rng) -> Case:
        out, dt = shape(rng), pick(rng, NUMBERS)
        return Case(op, [operand(values(rng, broadcastable(rng, out), dt), rng, 0.1)
                         for _ in range(int(rng.integers(1, 5)))])
    return gen


def shift(rng: Rng) -> Case:
    """Counts from -3 to 70: negative, within and past every operand width."""
    out, dt = shape(rng), pick(rng, (np.int8, np.uint8, np.int32, np.int64))
    x = values(rng, broadcastable(rng, out), dt)
    counts = rng.integers(-3, 71, broadcastable(rng, out)).astype(dt) if np.dtype(dt).kind == "i" else \
        rng.integers(0, 71, broadcastable(rng, out)).astype(dt)
    return Case("BitShift", [operand(x, rng, 0.1), operand(counts, rng)], {"direction": pick(rng, ["LEFT", "RIGHT"])})


def mod(rng: Rng) -> Case:
    case = binary("Mod", NUMBERS)(rng)
    fmod = 1 if case.operands[0][1].dtype.kind == "f" else int(rng.integers(0, 2))  # ONNX: floats need fmod=1
    return Case("Mod", case.operands, {"fmod": fmod})


def where(rng: Rng) -> Case:
    out, dt = shape(rng), pick(rng, ANY)
    return Case("Where", [operand(values(rng, broadcastable(rng, out), np.bool_), rng, 0.1),
                          operand(values(rng, broadcastable(rng, out), dt), rng),
                          operand(values(rng, broadcastable(rng, out), dt), rng)])


def cast(rng: Rng) -> Case:
    return Case("Cast", [x(rng, ANY)], {"to": DType.from_numpy(np.dtype(pick(rng, ANY)))})


def reduce(op: str) -> Callable[[Rng], Case]:
    def gen(rng: Rng) -> Case:
        xin = x(rng, NUMBERS, 1, 4)
        rank = xin[1].ndim
        axes = tuple(int(a) - (rank if rng.random() < 0.3 else 0)
                     for a in rng.choice(rank, int(rng.integers(0, rank + 1)), replace=False))
        return Case(op, [xin], {"axes": axes, "keepdims": int(rng.integers(0, 2))})
    return gen


def axis_op(op: str, lo: int = 1) -> Callable[[Rng], Case]:
    def gen(rng: Rng) -> Case:
        xin = x(rng, FLOATS, lo, 4)
        rank = xin[1].ndim
        return Case(op, [xin], {"axis": int(rng.integers(-rank, rank)) if rank else 0})
    return gen


def layer_norm(rng: Rng) -> Case:
    xin = x(rng, FLOATS, 1, 4)
    rank = xin[1].ndim
    axis = int(rng.integers(-rank, rank))
    norm = xin[1].shape[axis % rank:]
    ops = [xin, operand(values(rng, norm, xin[1].dtype), rng, 0.7)]
    if rng.random() < 0.6:
        ops.append(operand(values(rng, norm, xin[1].dtype), rng, 0.7))
    return Case("LayerNormalization", ops, {"axis": axis, "epsilon": float(pick(rng, [1e-5, 1e-3]))})


def batch_norm(rng: Rng) -> Case:
    shp = (dim(rng, 3), int(rng.integers(1, 5))) + shape(rng, 0, 2)
    dt = pick(rng, FLOATS)
    c = shp[1]
    var = np.abs(values(rng, (c,), dt)) + np.asarray(0.5, dt)
    return Case("BatchNormalization", [("x", values(rng, shp, dt), False)]
                + [operand(values(rng, (c,), dt), rng, 0.8) for _ in range(3)] + [operand(var, rng, 0.8)])


def spatial(rng: Rng, nd: int, lo: int = 1) -> tuple[int, ...]:
    return (dim(rng, 2), dim(rng, 4)) + tuple(dim(rng, 7) if rng.random() < 0.9 else 0 for _ in range(nd))


def geometry(rng: Rng, nd: int) -> dict:
    return {"strides": tuple(int(rng.integers(1, 4)) for _ in range(nd)),
            "pads": tuple(int(rng.integers(0, 3)) for _ in range(2 * nd)),
            "dilations": tuple(int(rng.integers(1, 3)) for _ in range(nd))}


def conv(rng: Rng) -> Case:
    """Finite values only: where a window covers padding the reference adds 0 * w (NaN for an
    infinite w) while native code skips the tap, and Winograd's transforms add inputs together
    before multiplying, so a non-finite value spreads differently. Neither is memory safety."""
    nd = int(rng.integers(1, 3))
    shp = spatial(rng, nd)
    group = pick(rng, [1, 1, 1, 2, shp[1] or 1])
    cin = shp[1]
    if group > 1 and cin % group:
        group = 1
    oc = int(rng.integers(1, 4)) * group
    kernel = tuple(int(rng.integers(1, 4)) for _ in range(nd))
    w = values(rng, (oc, cin // group if group else cin) + kernel, np.float32, specials=False)
    ops = [("x", values(rng, shp, np.float32, specials=False), False), operand(w, rng, 0.8)]
    if rng.random() < 0.5:
        ops.append(operand(values(rng, (oc,), np.float32, specials=False), rng, 0.8))
    return Case("Conv", ops, {**geometry(rng, nd), "group": group})


def conv_transpose(rng: Rng) -> Case:
    """Finite values, as for Conv; output_padding below the stride or the dilation, as ONNX asks."""
    nd = int(rng.integers(1, 3))
    shp = spatial(rng, nd)
    cin = shp[1]
    group = pick(rng, [1, 1, 2]) if cin and cin % 2 == 0 else 1
    mg = int(rng.integers(1, 4))
    kernel = tuple(int(rng.integers(1, 4)) for _ in range(nd))
    g = geometry(rng, nd)
    extra = tuple(int(rng.integers(0, max(s, d))) for s, d in zip(g["strides"], g["dilations"]))
    ops = [("x", values(rng, shp, np.float32, specials=False), False),
           operand(values(rng, (cin, mg) + kernel, np.float32, specials=False), rng, 0.8)]
    if rng.random() < 0.5:
        ops.append(operand(values(rng, (mg * group,), np.float32, specials=False), rng, 0.8))
    return Case("ConvTranspose", ops, {**g, "output_padding": extra, "group": group})


def resize(rng: Rng) -> Case:
    xin = x(rng, FLOATS + (np.uint8, np.int8, np.int32), 1, 4)
    shp = xin[1].shape
    mode = pick(rng, ["nearest", "linear", "cubic"]) if xin[1].dtype.kind == "f" else "nearest"
    sizes = tuple(-1 if rng.random() < 0.4 else dim(rng, 7) for _ in shp)
    scales = tuple(float((s if s >= 0 else n) / n) if n and (s if s >= 0 else n) else float(pick(rng, [0.5, 2.0, 1.5]))
                   for n, s in zip(shp, sizes))
    coord = pick(rng, ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
                       "half_pixel_symmetric"])
    roi = tuple(float(v) for v in rng.uniform(0, 0.4, len(shp))) + tuple(float(v) for v in rng.uniform(0.6, 1, len(shp))) \
        if coord == "tf_crop_and_resize" else ()
    return Case("Resize", [xin], {"sizes": sizes, "scales": scales, "roi": roi, "mode": mode,
                                  "coordinate_transformation_mode": coord,
                                  "nearest_mode": pick(rng, ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]),
                                  "exclude_outside": int(rng.integers(0, 2)), "antialias": int(rng.integers(0, 2)) if mode != "nearest" else 0,
                                  "extrapolation_value": float(pick(rng, [0.0, -1.5]))})


def pool(op: str) -> Callable[[Rng], Case]:
    def gen(rng: Rng) -> Case:
        nd = int(rng.integers(1, 3))
        g = geometry(rng, nd)
        attrs = {"kernel_shape": tuple(int(rng.integers(1, 4)) for _ in range(nd)), "strides": g["strides"],
                 "pads": g["pads"], "ceil_mode": int(rng.integers(0, 2))}
        if op == "MaxPool":
            attrs["dilations"] = g["dilations"]
        else:
            attrs["count_include_pad"] = int(rng.integers(0, 2))
        return Case(op, [("x", values(rng, spatial(rng, nd), pick(rng, FLOATS)), False)], attrs)
    return gen


def global_pool(rng: Rng) -> Case:
    return Case("GlobalAveragePool", [("x", values(rng, spatial(rng, int(rng.integers(1, 3))), pick(rng, FLOATS)), False)])


def lrn(rng: Rng) -> Case:
    return Case("LRN", [("x", values(rng, spatial(rng, 2), np.float32), False)],
                {"size": int(pick(rng, [1, 3, 5])), "alpha": 1e-3, "beta": 0.75, "bias": 1.0})


def gemm(rng: Rng) -> Case:
    m, k, n = dim(rng, 6), dim(rng, 6), dim(rng, 6)
    ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    a = values(rng, (k, m) if ta else (m, k), np.float32)
    b = values(rng, (n, k) if tb else (k, n), np.float32)
    ops = [("a", a, False), operand(b, rng, 0.6)]
    if rng.random() < 0.6:
        ops.append(operand(values(rng, broadcastable(rng, (m, n)), np.float32), rng, 0.6))
    return Case("Gemm", ops, {"alpha": float(pick(rng, [1.0, 0.5])), "beta": float(pick(rng, [1.0, 2.0])),
                              "transA": ta, "transB": tb})


def matmul(rng: Rng) -> Case:
    m, k, n = dim(rng, 5), dim(rng, 5), dim(rng, 5)
    batch = shape(rng, 0, 2, 3)
    a_shape = (broadcastable(rng, batch) + (m, k)) if rng.random() < 0.85 else (k,)
    b_shape = (broadcastable(rng, batch) + (k, n)) if rng.random() < 0.85 else (k,)
    dt = pick(rng, (np.float32, np.float32, np.float64))
    return Case("MatMul", [("a", values(rng, a_shape, dt), False), operand(values(rng, b_shape, dt), rng, 0.5)])


def reshape(rng: Rng) -> Case:
    xin = x(rng, ANY)
    shp = xin[1].shape
    total = math.prod(shp)
    target = list(np.random.default_rng(int(rng.integers(1 << 30))).permutation(list(shp))) if shp else []
    if target and rng.random() < 0.5:
        target[int(rng.integers(0, len(target)))] = -1
    if target and rng.random() < 0.3:
        i = int(rng.integers(0, min(len(target), len(shp))))
        target[i] = 0
    if rng.random() < 0.2:
        target = [total]
    return Case("Reshape", [xin], {"shape": tuple(int(t) for t in target)})


def flatten(rng: Rng) -> Case:
    xin = x(rng, ANY)
    r = xin[1].ndim
    return Case("Flatten", [xin], {"axis": int(rng.integers(-r, r + 1))})


def squeeze(rng: Rng) -> Case:
    shp = tuple(1 if rng.random() < 0.5 else dim(rng) for _ in range(int(rng.integers(1, 5))))
    ones = [i for i, d in enumerate(shp) if d == 1] or [0]
    axes = tuple(int(a) for a in rng.choice(ones, int(rng.integers(1, len(ones) + 1)), replace=False))
    return Case("Squeeze", [("x", values(rng, shp, pick(rng, ANY)), False)], {"axes": axes})


def unsqueeze(rng: Rng) -> Case:
    xin = x(rng, ANY, 0, 3)
    r = xin[1].ndim + int(rng.integers(1, 3))
    axes = tuple(int(a) for a in rng.choice(np.arange(-r, r), int(rng.integers(1, r - xin[1].ndim + 1)), replace=False))
    return Case("Unsqueeze", [xin], {"axes": axes})


def transpose(rng: Rng) -> Case:
    xin = x(rng, ANY, 1)
    return Case("Transpose", [xin], {"perm": tuple(int(p) for p in rng.permutation(xin[1].ndim))})


def expand(rng: Rng) -> Case:
    out = shape(rng, 0, 4)
    xin = ("x", values(rng, broadcastable(rng, out), pick(rng, ANY)), False)
    return Case("Expand", [xin], {"shape": out if rng.random() < 0.7 else broadcastable(rng, out)})


def slice_(rng: Rng) -> Case:
    xin = x(rng, ANY, 1)
    shp = xin[1].shape
    axes = [int(a) for a in rng.choice(len(shp), int(rng.integers(1, len(shp) + 1)), replace=False)]
    big = [2**63 - 1, -(2**63)]
    starts = [int(pick(rng, [rng.integers(-7, 8), rng.integers(-7, 8), pick(rng, big)])) for _ in axes]
    ends = [int(pick(rng, [rng.integers(-7, 8), rng.integers(-7, 8), pick(rng, big)])) for _ in axes]
    steps = [int(pick(rng, [1, 1, 2, 3, -1, -2])) for _ in axes]
    return Case("Slice", [xin], {"starts": tuple(starts), "ends": tuple(ends), "axes": tuple(axes), "steps": tuple(steps)})


def pad(rng: Rng) -> Case:
    xin = x(rng, NUMBERS, 1, 4)
    r = xin[1].ndim
    mode = pick(rng, ["constant", "constant", "edge", "reflect"])
    pads = tuple(int(rng.integers(-3 if mode == "constant" else 0, 4)) for _ in range(2 * r))
    return Case("Pad", [xin], {"pads": pads, "mode": mode, "value": float(pick(rng, [0.0, 1.5, -2.0]))})


def concat(rng: Rng) -> Case:
    base = shape(rng, 1, 4)
    axis = int(rng.integers(-len(base), len(base)))
    dt = pick(rng, ANY)
    parts = []
    for _ in range(int(rng.integers(1, 5))):
        s = list(base)
        s[axis] = dim(rng)
        parts.append(operand(values(rng, tuple(s), dt), rng, 0.2))
    return Case("Concat", parts, {"axis": axis})


def split(rng: Rng) -> Case:
    xin = x(rng, ANY, 1)
    shp = xin[1].shape
    axis = int(rng.integers(-len(shp), len(shp)))
    total, parts = shp[axis], []
    while total > 0 and len(parts) < 4:
        take = int(rng.integers(0, total + 1))
        parts.append(take)
        total -= take
    parts.append(total)
    return Case("Split", [xin], {"axis": axis, "split": tuple(parts)}, outputs=len(parts))


def gather(rng: Rng) -> Case:
    xin = x(rng, ANY, 1)
    shp = xin[1].shape
    axis = int(rng.integers(-len(shp), len(shp)))
    d = shp[axis]
    lo, hi = (-d, d) if rng.random() < 0.85 else (-d - 2, d + 2)
    idx = rng.integers(lo, hi, shape(rng, 0, 2)) if hi > lo else np.zeros(shape(rng, 0, 2), np.int64)
    return Case("Gather", [xin, operand(idx.astype(pick(rng, [np.int64, np.int32])), rng, 0.3)], {"axis": axis})


def gather_elements(rng: Rng) -> Case:
    xin = x(rng, ANY, 1)
    shp = xin[1].shape
    axis = int(rng.integers(-len(shp), len(shp)))
    d = shp[axis]
    ishape = tuple(int(rng.integers(0, n + 1)) if k != axis % len(shp) else dim(rng) for k, n in enumerate(shp))
    lo, hi = (-d, d) if rng.random() < 0.85 else (-d - 2, d + 2)
    idx = rng.integers(lo, hi, ishape) if hi > lo else np.zeros(ishape, np.int64)
    return Case("GatherElements", [xin, operand(idx.astype(pick(rng, [np.int64, np.int32])), rng, 0.3)], {"axis": axis})


def arg(op: str) -> Callable[[Rng], Case]:
    def gen(rng: Rng) -> Case:
        xin = x(rng, NUMBERS, 1, 4)
        r = xin[1].ndim
        return Case(op, [xin], {"axis": int(rng.integers(-r, r)), "keepdims": int(rng.integers(0, 2)),
                                "select_last_index": int(rng.integers(0, 2))})
    return gen


def cumsum(rng: Rng) -> Case:
    xin = x(rng, NUMBERS, 1, 4)
    r = xin[1].ndim
    return Case("CumSum", [xin], {"axis": int(rng.integers(-r, r)), "exclusive": int(rng.integers(0, 2)),
                                  "reverse": int(rng.integers(0, 2))})


def trilu(rng: Rng) -> Case:
    return Case("Trilu", [x(rng, ANY, 2, 4)], {"upper": int(rng.integers(0, 2)), "k": int(rng.integers(-4, 5))})


def shape_op(rng: Rng) -> Case:
    return Case("Shape", [x(rng, ANY)])


def _scale(rng: Rng) -> float:
    return float(pick(rng, [0.02, 0.1, 0.5, 1.0, 3.0]))


def _qdtype(rng: Rng) -> DType:
    return pick(rng, [DType.I8, DType.U8])


def _zp(rng: Rng, dt: DType) -> int:
    return int(rng.integers(-5, 6)) + (128 if dt is DType.U8 else 0)


def _out_attrs(rng: Rng) -> dict:
    to = _qdtype(rng)
    lo, hi = (-128, 127) if to is DType.I8 else (0, 255)
    clamp = () if rng.random() < 0.7 else (int(rng.integers(lo, 0 if lo else 100)), hi)
    return {"y_scale": _scale(rng), "y_zero_point": _zp(rng, to), "to": to, "clamp": clamp}


def _qvalues(rng: Rng, shp, dt: DType) -> np.ndarray:
    lo, hi = (-128, 128) if dt is DType.I8 else (0, 256)
    return rng.integers(lo, hi, shp).astype(dt.numpy)


def _per(rng: Rng, t_shape, axis_ok=True) -> tuple[tuple[float, ...], tuple[int, ...], int, DType]:
    dt = _qdtype(rng)
    if axis_ok and t_shape and rng.random() < 0.4:
        axis = int(rng.integers(-len(t_shape), len(t_shape)))
        n = t_shape[axis]
        return tuple(_scale(rng) for _ in range(n)), tuple(_zp(rng, dt) for _ in range(n)), axis, dt
    return (_scale(rng),), (_zp(rng, dt),), 1, dt


def quantize(rng: Rng) -> Case:
    xin = x(rng, FLOATS)
    scale, zp, axis, dt = _per(rng, xin[1].shape)
    return Case("QuantizeLinear", [xin], {"scale": scale, "zero_point": zp, "axis": axis, "to": dt})


def dequantize(rng: Rng) -> Case:
    shp = shape(rng)
    scale, zp, axis, dt = _per(rng, shp)
    return Case("DequantizeLinear", [("x", _qvalues(rng, shp, dt), False)], {"scale": scale, "zero_point": zp, "axis": axis})


def qadd(rng: Rng) -> Case:
    out = shape(rng)
    a_dt, b_dt = _qdtype(rng), _qdtype(rng)
    return Case("QAdd", [operand(_qvalues(rng, broadcastable(rng, out), a_dt), rng, 0.1),
                         operand(_qvalues(rng, broadcastable(rng, out), b_dt), rng, 0.2)],
                {"a_scale": _scale(rng), "a_zero_point": _zp(rng, a_dt), "b_scale": _scale(rng),
                 "b_zero_point": _zp(rng, b_dt), **_out_attrs(rng)})


def qmatmul(rng: Rng) -> Case:
    m, k, n = dim(rng, 6), dim(rng, 9), dim(rng, 6)
    a_dt = _qdtype(rng)
    ops = [("a", _qvalues(rng, shape(rng, 0, 2, 3) + (m, k), a_dt), False), operand(_qvalues(rng, (k, n), DType.I8), rng, 0.8)]
    if rng.random() < 0.5:
        ops.append(operand(rng.integers(-500, 500, (n,)).astype(np.int32), rng, 0.8))
    b_scale = (_scale(rng),) if rng.random() < 0.5 or not n else tuple(_scale(rng) for _ in range(n))
    return Case("QMatMul", ops, {"a_scale": _scale(rng), "a_zero_point": _zp(rng, a_dt), "b_scale": b_scale,
                                 **_out_attrs(rng)})


def qconv(rng: Rng) -> Case:
    base = conv(rng)
    xv, wv = base.operands[0][1], base.operands[1][1]
    x_dt = _qdtype(rng)
    ops = [("x", _qvalues(rng, xv.shape, x_dt), False), (base.operands[1][0], _qvalues(rng, wv.shape, DType.I8),
                                                         base.operands[1][2])]
    m = wv.shape[0]
    if len(base.operands) == 3:
        ops.append(operand(rng.integers(-500, 500, (m,)).astype(np.int32), rng, 0.8))
    w_scale = (_scale(rng),) if rng.random() < 0.5 else tuple(_scale(rng) for _ in range(m))
    return Case("QConv", ops, {**base.attrs, "x_scale": _scale(rng), "x_zero_point": _zp(rng, x_dt),
                               "w_scale": w_scale, **_out_attrs(rng)})


FLOAT_UNARY = ["Abs", "Erf", "Exp", "Log", "Neg", "Reciprocal", "Relu", "Sigmoid", "SiLU", "Sqrt", "Tanh",
               "HardSwish", "Identity", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cos", "Cosh", "Sin",
               "Sinh", "Tan", "Ceil", "Floor", "Round", "Sign", "IsNaN"]
INTS = (np.int8, np.uint8, np.int32, np.int64)
GENERATORS: dict[str, Callable[[Rng], Case]] = {
    **{op: unary(op, NUMBERS if op in ("Abs", "Neg", "Relu", "Identity", "Sign") else FLOATS) for op in FLOAT_UNARY},
    "IsInf": unary("IsInf", detect_negative=lambda r: int(r.integers(0, 2)), detect_positive=lambda r: int(r.integers(0, 2))),
    "Not": unary("Not", (np.bool_,)), "BitwiseNot": unary("BitwiseNot", INTS),
    **{op: binary(op, (np.bool_,)) for op in ("And", "Or", "Xor")},
    **{op: binary(op, INTS) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")},
    "BitShift": shift, "Mod": mod,
    "Gelu": unary("Gelu", approximate=lambda r: pick(r, ["none", "tanh"])),
    "HardSigmoid": unary("HardSigmoid", alpha=lambda r: float(pick(r, [0.2, 0.5])), beta=lambda r: 0.5),
    "LeakyRelu": unary("LeakyRelu", alpha=lambda r: float(pick(r, [0.01, 0.3]))),
    "Clip": unary("Clip", min=lambda r: float(pick(r, [-np.inf, -1.0, 0.0])), max=lambda r: float(pick(r, [np.inf, 1.0, 6.0]))),
    "Dropout": unary("Dropout"),
    **{op: binary(op) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Greater", "Less", "GreaterOrEqual",
                                 "LessOrEqual")},
    **{op: variadic(op) for op in ("Max", "Min", "Sum", "Mean")},
    "Where": where, "Cast": cast,
    **{op: reduce(op) for op in ("ReduceMax", "ReduceMean", "ReduceSum", "ReduceMin", "ReduceProd")},
    "ArgMax": arg("ArgMax"), "ArgMin": arg("ArgMin"), "CumSum": cumsum, "Trilu": trilu,
    "GatherElements": gather_elements,
    "Softmax": axis_op("Softmax"), "LogSoftmax": axis_op("LogSoftmax"),
    "LayerNormalization": layer_norm, "BatchNormalization": batch_norm, "LRN": lrn,
    "Conv": conv, "ConvTranspose": conv_transpose, "Resize": resize, "MaxPool": pool("MaxPool"), "AveragePool": pool("AveragePool"), "GlobalAveragePool": global_pool,
    "Gemm": gemm, "MatMul": matmul,
    "Reshape": reshape, "Flatten": flatten, "Squeeze": squeeze, "Unsqueeze": unsqueeze, "Transpose": transpose,
    "Expand": expand, "Slice": slice_, "Pad": pad, "Concat": concat, "Split": split, "Gather": gather,
    "Shape": shape_op,
    "QuantizeLinear": quantize, "DequantizeLinear": dequantize, "QAdd": qadd, "QMatMul": qmatmul, "QConv": qconv,
}
NOT_FUZZED = {
    "FusedConv": "made by the fusion pass from Conv + epilogue; tests/compiler/ops/test_fused_ops.py checks it",
    "FusedGemm": "made by the fusion pass from Gemm + epilogue; tests/compiler/ops/test_fused_ops.py checks it",
    "FusedElementwise": "made by the fusion pass from element-wise chains; test_fused_ops.py checks it",
}


# --- building, running, comparing ------------------------------------------------------------------
@dataclass
class Built:
    case: Case
    node: Node
    feeds: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    types: dict[str, TensorType]
    ref: list[np.ndarray] | None = None
    ref_error: str | None = None


def build(case: Case, prefix: str) -> Built | None:
    """The case as one node over prefixed names, or None when the verifier would refuse it."""
    feeds, consts, types, names = {}, {}, {}, []
    for i, (role, value, is_const) in enumerate(case.operands):
        name = f"{prefix}_{role}{i}"
        names.append(name)
        value = np.ascontiguousarray(value)
        (consts if is_const else feeds)[name] = value
        types[name] = TensorType(DType.from_numpy(value.dtype), tuple(value.shape))
    outs = [f"{prefix}_y{j}" for j in range(case.outputs)]
    try:
        node = Node.make(case.op, names, outs, name=prefix, **case.attrs)
        g = infer_graph_types(prefix, {n: types[n] for n in feeds}, {n: _ro(v) for n, v in consts.items()}, [node], outs)
    except (CuvilError, ValueError):
        return None
    built = Built(case, node, feeds, {n: _ro(v) for n, v in consts.items()}, dict(g.types))
    try:
        with np.errstate(all="ignore"):
            out = run_reference(g, feeds)
        built.ref = [out[o] for o in outs]
    except CuvilError as e:
        built.ref_error = str(e)
    except Exception as e:  # noqa: BLE001 - an untyped failure of the reference is itself a finding
        built.ref_error = f"UNTYPED {type(e).__name__}: {e}"
    return built


def _ro(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def graph_of(built: list[Built], name: str = "fuzz"):
    """One graph holding every case's node, side by side."""
    inputs = {n: b.types[n] for b in built for n in b.feeds}
    consts = {n: v for b in built for n, v in b.constants.items()}
    outs = [o for b in built for o in b.node.outputs]
    return infer_graph_types(name, inputs, consts, [b.node for b in built], outs)


TOLERANCE = {np.dtype(np.float16): (2e-3, 2e-3), np.dtype(np.float32): (2e-4, 2e-5), np.dtype(np.float64): (1e-9, 1e-12)}


def mismatch(b: Built, got: dict[str, np.ndarray]) -> str | None:
    """Why the native outputs differ from the reference's, or None when they agree."""
    for o, want in zip(b.node.outputs, b.ref):
        t = b.types[o]
        if tuple(want.shape) != tuple(t.shape) or want.dtype != t.dtype.numpy:
            return f"reference gives {want.dtype}{list(want.shape)}, the shape rule says {t}"
        have = got[o]
        if have.shape != want.shape or have.dtype != want.dtype:
            return f"native gives {have.dtype}{list(have.shape)}, reference {want.dtype}{list(want.shape)}"
        if want.dtype.kind == "f":
            rtol, atol = TOLERANCE[want.dtype]
            w, h = want.astype(np.float64), have.astype(np.float64)
            if not np.array_equal(np.isnan(w), np.isnan(h)):
                return f"NaN at other places: native {h.ravel()[:6]}, reference {w.ravel()[:6]}"
            ok = ~np.isnan(w)
            if not np.allclose(h[ok], w[ok], rtol=rtol, atol=atol):
                k = int(np.argmax(np.abs(h[ok] - w[ok])))
                return f"values differ: native {h[ok][k]!r}, reference {w[ok][k]!r}"
        elif not np.array_equal(have, want):
            return f"values differ: native {have.ravel()[:6]}, reference {want.ravel()[:6]}"
    return None


def generate(rng: Rng, count: int, ops=None) -> tuple[list[Built], int]:
    """``count`` admitted cases (round-robin over ``ops``), and how many proposals were refused."""
    ops = sorted(ops or GENERATORS)
    admitted, refused, i = [], 0, 0
    while len(admitted) < count and refused < 50 * count:
        op = ops[i % len(ops)]
        i += 1
        b = build(GENERATORS[op](rng), f"c{i}")
        if b is None:
            refused += 1
        else:
            admitted.append(b)
    return admitted, refused


@dataclass
class Outcome:
    """What native code did with one case: ``outputs``, or a typed ``refused`` reason, or a ``crash``."""

    outputs: dict[str, np.ndarray] | None = None
    refused: str | None = None
    crash: str | None = None


def native_runner(workdir, guard_pages: bool = True):
    """Compile and run a chunk on this machine, in a forked child (a memory fault is a finding, not the end)."""
    import faulthandler
    import os
    import pickle
    import tempfile

    def run(chunk: list[Built]) -> tuple[str, object]:
        fd, path = tempfile.mkstemp(dir=workdir, suffix=".pkl")
        os.close(fd)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            faulthandler.disable()  # a fault is reported by the parent, with the case that caused it
            code = 0
            try:
                from cuvil.edge_runtime.compile import compile_graph

                try:
                    sess = compile_graph(graph_of(chunk), use_cache=False, optimize=False, guard_pages=guard_pages)
                    result = ("outputs", sess.run({n: v for b in chunk for n, v in b.feeds.items()}))
                except CuvilError as e:
                    result = ("refused", f"{type(e).__name__}: {e}")
                except Exception as e:  # noqa: BLE001
                    result = ("crash", f"untyped {type(e).__name__}: {e}")
                with open(path, "wb") as f:
                    pickle.dump(result, f)
            except BaseException:  # noqa: BLE001
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        try:
            if os.WIFSIGNALED(status):
                return "crash", f"killed by signal {os.WTERMSIG(status)}"
            with open(path, "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError, pickle.PickleError):
            return "crash", f"child exited with status {status}"
        finally:
            os.unlink(path)

    return run


def emulated_runner(workdir, profile: str = "rpi5"):
    """Cross-compile a chunk for ``profile`` and run it under qemu in the guard-page harness."""
    from cuvil.devices.emulation import EmulationError
    from cuvil.edge_runtime.emulated import EmulatedModel

    def run(chunk: list[Built]) -> tuple[str, object]:
        try:
            em = EmulatedModel(graph_of(chunk), profile, use_cache=False, workdir=workdir)
            try:
                (out,) = em.run([{n: v for b in chunk for n, v in b.feeds.items()}])
            finally:
                em.close()
            return "outputs", out
        except EmulationError as e:
            fault = "signal" in str(e) or "fault" in str(e) or "bus error" in str(e)
            return ("crash" if fault else "refused"), str(e)
        except CuvilError as e:
            return "refused", f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001
            return "crash", f"untyped {type(e).__name__}: {e}"

    return run


def outcomes(chunk: list[Built], run) -> dict[str, Outcome]:
    """Run the chunk as one graph; a chunk that fails is split until the failing case is alone."""
    kind, detail = run(chunk)
    if kind == "outputs":
        return {b.node.name: Outcome(outputs={o: detail[o] for o in b.node.outputs}) for b in chunk}
    if len(chunk) > 1:
        half = len(chunk) // 2
        return {**outcomes(chunk[:half], run), **outcomes(chunk[half:], run)}
    return {chunk[0].node.name: Outcome(refused=detail) if kind == "refused" else Outcome(crash=detail)}


def finding(b: Built, outcome: Outcome) -> str | None:
    """What is wrong with one case, or None: the reference must not crash, native code must not crash,
    and must compute what the reference computes, or refuse (typed) where the reference refuses."""
    if b.ref_error and b.ref_error.startswith("UNTYPED"):
        return f"the reference fails untyped on a verified graph: {b.ref_error}"
    if outcome.crash:
        return f"native code crashes: {outcome.crash}"
    if b.ref is None:
        return None if outcome.refused else "native code computes where the reference refuses"
    if outcome.refused:
        return f"native code refuses where the reference computes: {outcome.refused}"
    return mismatch(b, outcome.outputs)


def fuzz(rng: Rng, count: int, run, per_graph: int = 40, ops=None):
    """Run ``count`` admitted cases with ``run`` (a runner above); return (findings as (case, reason),
    cases, refused proposals)."""
    cases, refused = generate(rng, count, ops)
    computed = [b for b in cases if b.ref is not None]
    alone = [[b] for b in cases if b.ref is None]  # each runs alone: it must refuse at run time
    chunks = [computed[i:i + per_graph] for i in range(0, len(computed), per_graph)] + alone
    seen: dict[str, Outcome] = {}
    for chunk in chunks:
        seen.update(outcomes(chunk, run))
    findings = [(b, why) for b in cases if (why := finding(b, seen[b.node.name]))]
    return findings, cases, refused


def main() -> None:  # pragma: no cover - a hunting tool
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-graph", type=int, default=40)
    ap.add_argument("--ops", default="")
    ap.add_argument("--qemu", default="", help="a device profile to emulate (rpi5, arm64-sve2, ...) instead of native")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = emulated_runner(tmp, args.qemu) if args.qemu else native_runner(tmp)
        findings, cases, refused = fuzz(np.random.default_rng(args.seed), args.cases, run, args.per_graph,
                                        args.ops.split(",") if args.ops else None)
    print(f"{len(cases)} cases admitted, {refused} proposals refused by the verifier")
    for b, why in findings:
        print(f"FINDING {b.case.describe()}: {why}"[:500])
    print(f"{len(findings)} findings")


if __name__ == "__main__":  # pragma: no cover
    main()
