"""The op fuzzer's cases: random single-op cases (random ranks, dims with zeros, attributes, dtypes), one
generator per op family; ``op_fuzz.py`` builds, runs and compares them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cuvil.compiler import DType

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
WIDE_INTS = (np.int16, np.uint16, np.uint32, np.uint64)
"""The integer dtypes only a Cast fuzz of its own draws: in ANY they would change every seeded case."""


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


def cast(rng: Rng, dtypes=ANY) -> Case:
    return Case("Cast", [x(rng, dtypes)], {"to": DType.from_numpy(np.dtype(pick(rng, dtypes)))})


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
}
NOT_FUZZED = {
    "FusedConv": "made by the fusion pass from Conv + epilogue; tests/compiler/ops/test_fused_ops.py checks it",
    "FusedGemm": "made by the fusion pass from Gemm + epilogue; tests/compiler/ops/test_fused_ops.py checks it",
    "FusedElementwise": "made by the fusion pass from element-wise chains; test_fused_ops.py checks it",
}
