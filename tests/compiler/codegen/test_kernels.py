"""Every op's native kernel, JIT-compiled for the host, against the reference interpreter.

Graphs are compiled without the graph passes so each op reaches its own kernel. Shapes include
odd sizes that are no multiple of any vector width (remainder loops). Weights are tested both as
constants (the packed path) and as inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.errors import RunTimeCheckError
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.memory.planner import plan_memory
from cuvil.edge_runtime.compile import compile_graph

RTOL, ATOL = 1e-4, 1e-5
F32, I32, I64, BOOL = np.float32, np.int32, np.int64, np.bool_


def run_op(op: str, inputs: Sequence[np.ndarray], consts: Sequence[np.ndarray] = (), n_out: int = 1,
           cache_dir=None, **attrs):
    """Build a one-node graph (inputs, then constants as the remaining operands); compare outputs."""
    gb = GraphBuilder(f"t_{op}")
    feeds, names = {}, []
    for i, x in enumerate(inputs):
        name = gb.input(f"x{i}", TensorType(DType.from_numpy(x.dtype), tuple(x.shape)))
        feeds[name] = x
        names.append(name)
    names += [gb.constant(c, f"c{i}") for i, c in enumerate(consts)]
    outs = gb.add(op, names, n_outputs=n_out, **attrs)
    graph = gb.build(outs)
    sess = compile_graph(graph, cache_dir=cache_dir, optimize=False)
    got = sess.run(feeds)
    want = run_reference(graph, feeds)
    for name in graph.outputs:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        if want[name].dtype.kind == "f":
            np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=f"{op} {name}")
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{op} {name}")
    return sess


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


def rnd(*shape, dtype=F32, lo=-3.0, hi=3.0, seed=0):
    rng = np.random.default_rng(seed + sum(shape) * 7 + len(shape))
    if np.dtype(dtype).kind == "f":
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(int(lo) * 5, int(hi) * 5 + 1, size=shape).astype(dtype)


SHAPES = [(37,), (3, 37), (2, 5, 17), (1, 129), (4, 16)]

# ---------------------------------------------------------------------------------- elementwise ---
UNARY = {
    "Relu": {}, "Clip": {"min": -0.5, "max": 1.25}, "LeakyRelu": {"alpha": 0.07}, "Sigmoid": {}, "Tanh": {},
    "Gelu": {}, "SiLU": {}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}, "HardSwish": {}, "Erf": {},
    "Exp": {}, "Neg": {}, "Abs": {}, "Identity": {}, "Dropout": {},
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, shape):
    run_op(op, [rnd(*shape, lo=-6, hi=6)], **UNARY[op])


@pytest.mark.parametrize("op", ["Sqrt", "Log", "Reciprocal"])
@pytest.mark.parametrize("shape", [(3, 37), (1, 129)])
def test_unary_positive(op, shape):
    run_op(op, [rnd(*shape, lo=0.05, hi=50)])


def test_gelu_tanh_and_wide_ranges():
    run_op("Gelu", [rnd(5, 33, lo=-8, hi=8)], approximate="tanh")
    x = np.concatenate([rnd(200, lo=-100, hi=100), np.array([0.0, -0.0, 1e-6, -1e-6, 88.0, -88.0], F32)]).astype(F32)
    for op in ("Tanh", "Sigmoid", "Erf", "Exp", "SiLU"):
        run_op(op, [x])
    run_op("Log", [np.array([1e-30, 1e-5, 0.5, 1.0, 2.0, 1e5, 3e38], F32)])


@pytest.mark.parametrize("dtype", [I32, I64])
@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs", "Identity"])
def test_unary_int(op, dtype):
    run_op(op, [rnd(3, 19, dtype=dtype)])


BROADCAST = [((3, 37), (3, 37)), ((3, 37), (37,)), ((2, 5, 17), (5, 1)), ((1, 129), ()), ((4, 1, 3), (1, 5, 1))]


@pytest.mark.parametrize("shapes", BROADCAST)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum"])
def test_binary(op, shapes):
    a, b = rnd(*shapes[0]), rnd(*shapes[1], lo=0.5, hi=3.0, seed=1)
    run_op(op, [a, b])
    run_op(op, [a], consts=[b])  # constant operand (a one-element one is folded into the code)


def test_pow():
    run_op("Pow", [rnd(3, 37, lo=0.1, hi=3), rnd(37, lo=-2, hi=2, seed=2)])
    for e in (2.0, 0.5, 3.0, -1.0, 1.7):
        run_op("Pow", [rnd(3, 37, lo=0.1, hi=3)], consts=[np.array(e, F32)])
    run_op("Pow", [np.array([-2.0, -2.0, -3.0, 0.0, 0.0, 2.0], F32), np.array([2.0, 3.0, 0.0, 2.0, 0.0, -1.0], F32)])


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
def test_variadic(op):
    run_op(op, [rnd(3, 37), rnd(37, seed=1), rnd(3, 1, seed=2)])
    run_op(op, [rnd(5, 7)])


@pytest.mark.parametrize("dtype", [I32, I64])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_int(op, dtype):
    b = rnd(19, dtype=dtype, seed=3)
    b[b == 0] = 3
    run_op(op, [rnd(3, 19, dtype=dtype), b])


@pytest.mark.parametrize("dtype", [F32, I64, I32])
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater"])
def test_compare(op, dtype):
    a = rnd(3, 37, dtype=dtype)
    b = a.copy()
    b[:, ::3] = rnd(37, dtype=dtype, seed=4)[::3]
    run_op(op, [a, b])
    run_op(op, [a, rnd(37, dtype=dtype, seed=5)])


@pytest.mark.parametrize("dtype", [F32, I64])
def test_where(dtype):
    run_op("Where", [rnd(3, 37, dtype=BOOL), rnd(3, 37, dtype=dtype), rnd(37, dtype=dtype, seed=1)])
    run_op("Where", [rnd(37, dtype=BOOL)], consts=[rnd(2, 1, dtype=dtype), np.array(-1, dtype)])


CASTS = [(F32, I32), (F32, I64), (I64, F32), (I32, I64), (I64, I32), (F32, BOOL), (BOOL, F32), (I64, BOOL),
         (BOOL, I32), (np.float64, F32), (F32, np.float64), (np.uint8, F32), (F32, np.int8), (F32, F32)]


@pytest.mark.parametrize("src,dst", CASTS)
def test_cast(src, dst):
    x = rnd(3, 37, dtype=src, lo=-100, hi=100)
    if np.dtype(src) == np.uint8 or np.dtype(dst) == np.uint8:
        x = np.abs(x)
    run_op("Cast", [x], to=DType.from_numpy(dst))


def test_fused_elementwise():
    x, s, b = rnd(2, 7, 9), rnd(7, 1, seed=1), rnd(7, 1, seed=2)
    run_op("FusedElementwise", [x, s, b], program="Mul(0,1);Add(3,2);Clip{max=6.0,min=0.0}(4)")
    run_op("FusedElementwise", [x], consts=[s, np.array(0.5, F32)], program="Sub(0,1);Mul(3,2);Sigmoid(4);Mul(5,0)")


# -------------------------------------------------------------------------------------- shape ---
X = rnd(2, 3, 5, 7)


@pytest.mark.parametrize("op,attrs", [
    ("Reshape", {"shape": (6, -1)}), ("Reshape", {"shape": (0, 0, 35)}), ("Flatten", {"axis": 2}),
    ("Squeeze", {"axes": (0,)}), ("Unsqueeze", {"axes": (0, 3)}), ("Transpose", {"perm": (0, 2, 3, 1)}),
    ("Transpose", {"perm": (3, 1, 0, 2)}), ("Expand", {"shape": (4, 3, 37)}),
])
def test_shape_ops(op, attrs):
    x = rnd(1, 3, 37) if op in ("Squeeze", "Expand") else X
    if op == "Expand":
        x = rnd(1, 37)
    run_op(op, [x], **attrs)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_split(axis):
    a, b = rnd(2, 3, 37), rnd(2, 3, 37, seed=1)
    run_op("Concat", [a, b, a], axis=axis)
    run_op("Concat", [a], consts=[b], axis=axis)
    d = a.shape[axis]
    run_op("Split", [a], n_out=2, axis=axis, split=(1, d - 1))


@pytest.mark.parametrize("attrs", [
    {"starts": (1,), "ends": (30,), "axes": (2,), "steps": (1,)},
    {"starts": (0, 1), "ends": (2, 100), "axes": (1, 3), "steps": (1, 2)},
    {"starts": (-1,), "ends": (-1000,), "axes": (-1,), "steps": (-2,)},
])
def test_slice(attrs):
    run_op("Slice", [rnd(2, 3, 5, 37)], **attrs)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode):
    run_op("Pad", [rnd(2, 3, 5, 7)], pads=(0, 0, 2, 1, 0, 1, 1, 3), mode=mode, value=1.5)


def test_pad_crop():
    run_op("Pad", [rnd(3, 9)], pads=(1, -2, -1, 3))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather(axis):
    x = rnd(4, 5, 6)
    d = x.shape[axis]
    run_op("Gather", [x, np.array([[0, d - 1], [-1, 1]], I64)], axis=axis)
    run_op("Gather", [x], consts=[np.array([2, -d], I32)], axis=axis)
    run_op("Gather", [x], consts=[np.array(1, I64)], axis=axis)


def test_gather_refuses_indices_outside_the_axis():
    """Outside [-d, d) the reference refuses, so the compiled model does: a typed error, nothing read
    outside the data (an empty axis included: every index is outside it), and the next run is clean."""
    x = rnd(2, 3, 4)
    sess = run_op("Gather", [x, np.array([0, -3, 2], I64)], axis=1)
    for bad in ([0, 3, 1], [-4, 0, 0], [2**40, 0, 0]):
        with pytest.raises(RunTimeCheckError):
            sess.run({"x0": x, "x1": np.array(bad, I64)})
    got = sess.run({"x0": x, "x1": np.array([2, 1, -1], I64)})
    np.testing.assert_array_equal(next(iter(got.values())), x[:, [2, 1, 2]])
    gb = GraphBuilder("empty_axis")
    data = gb.input("data", TensorType(DType.F32, (3, 0, 1 << 20)))
    idx = gb.input("idx", TensorType(DType.I64, (2,)))
    empty = compile_graph(gb.build(gb.add("Gather", [data, idx], axis=1)), optimize=False)
    with pytest.raises(RunTimeCheckError):
        empty.run({"data": np.zeros((3, 0, 1 << 20), np.float32), "idx": np.zeros(2, I64)})
    gb = GraphBuilder("no_rows")  # an empty output: the indices are checked all the same
    data = gb.input("data", TensorType(DType.F32, (0, 5)))
    idx = gb.input("idx", TensorType(DType.I32, (2,)))
    rows = compile_graph(gb.build(gb.add("Gather", [data, idx], axis=1)), optimize=False)
    assert rows.run({"data": np.zeros((0, 5), np.float32), "idx": np.array([4, -5], I32)})
    with pytest.raises(RunTimeCheckError):
        rows.run({"data": np.zeros((0, 5), np.float32), "idx": np.array([5, 0], I32)})


def test_shape_op():
    run_op("Shape", [rnd(2, 3, 5)])


# ---------------------------------------------------------------------------------- reductions ---
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [(), (1,), (-1,), (0, 2), (1, 2, 3)])
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_reduce(op, axes, keepdims):
    run_op(op, [rnd(2, 3, 5, 37)], axes=axes, keepdims=keepdims)


@pytest.mark.parametrize("dtype", [I32, I64])
def test_reduce_int(dtype):
    run_op("ReduceSum", [rnd(3, 19, dtype=dtype)], axes=(1,))
    run_op("ReduceMax", [rnd(3, 19, dtype=dtype)], axes=(0,))


@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op, axis):
    run_op(op, [rnd(3, 5, 37, lo=-20, hi=20)], axis=axis)


# ------------------------------------------------------------------------------ normalisation ---
def test_batch_norm():
    c = 5
    params = [rnd(c, lo=0.5, hi=1.5), rnd(c, seed=1), rnd(c, seed=2), rnd(c, lo=0.1, hi=2, seed=3)]
    run_op("BatchNormalization", [rnd(2, c, 7, 9)], consts=params, epsilon=1e-3)
    run_op("BatchNormalization", [rnd(3, c), *params])


@pytest.mark.parametrize("axis,pshape", [(-1, (37,)), (-2, (5, 37)), (1, (5, 37)), (-2, (37,))])
def test_layer_norm(axis, pshape):
    x = rnd(3, 5, 37)
    run_op("LayerNormalization", [x], consts=[rnd(*pshape, seed=1), rnd(*pshape, seed=2)], axis=axis)
    run_op("LayerNormalization", [x, rnd(*pshape, seed=1)], axis=axis, epsilon=1e-3)


@pytest.mark.parametrize("size", [1, 3, 4, 5])
def test_lrn(size):
    run_op("LRN", [rnd(2, 7, 5, 6)], size=size, alpha=1e-2, beta=0.75, bias=2.0)


# ------------------------------------------------------------------------------------- pooling ---
POOLS = [
    {"kernel_shape": (2, 2), "strides": (2, 2), "pads": (0, 0, 0, 0)},
    {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)},
    {"kernel_shape": (3, 2), "strides": (1, 2), "pads": (1, 0, 0, 1), "ceil_mode": 1},
    {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 0, 0, 0), "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", POOLS)
def test_max_pool(attrs):
    x = rnd(2, 3, 11, 9)
    run_op("MaxPool", [x], dilations=(1, 1), **attrs)
    if not attrs.get("ceil_mode"):
        run_op("MaxPool", [x], dilations=(2, 1), **attrs)


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize("attrs", POOLS)
def test_avg_pool(attrs, include):
    run_op("AveragePool", [rnd(2, 3, 11, 9)], count_include_pad=include, **attrs)


def test_pool_1d_and_global():
    run_op("MaxPool", [rnd(2, 3, 17)], kernel_shape=(3,), strides=(2,), pads=(1, 1), dilations=(1,))
    run_op("AveragePool", [rnd(2, 3, 17)], kernel_shape=(3,), strides=(1,), pads=(1, 1))
    run_op("GlobalAveragePool", [rnd(2, 3, 7, 9)])
    run_op("GlobalAveragePool", [rnd(1, 5, 13)])


# -------------------------------------------------------------------------------------- linalg ---
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("mkn", [(1, 37, 19), (5, 16, 33), (7, 3, 1)])
def test_gemm(mkn, ta, tb):
    m, k, n = mkn
    a = rnd(*((k, m) if ta else (m, k)))
    b = rnd(*((n, k) if tb else (k, n)), seed=1)
    run_op("Gemm", [a], consts=[b, rnd(n, seed=2)], transA=ta, transB=tb)
    run_op("Gemm", [a, b, rnd(m, 1, seed=3)], transA=ta, transB=tb, alpha=0.5, beta=2.0)
    run_op("Gemm", [a], consts=[b], transA=ta, transB=tb, alpha=1.5)


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 9)), ((37,), (37, 3)), ((4, 37), (37,)), ((37,), (37,)),
                                   ((2, 3, 5, 7), (7, 4)), ((2, 1, 5, 7), (3, 7, 6)), ((1, 129), (129, 17)),
                                   ((1, 3, 17, 8), (1, 3, 8, 65))])
def test_matmul(sa, sb):
    a, b = rnd(*sa), rnd(*sb, seed=1)
    run_op("MatMul", [a, b])
    run_op("MatMul", [a], consts=[b])


def test_matmul_int():
    run_op("MatMul", [rnd(3, 5, dtype=I32), rnd(5, 4, dtype=I32, seed=1)])


CONVS = [
    {"x": (1, 3, 9, 11), "w": (8, 3, 3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1},
    {"x": (2, 4, 10, 9), "w": (6, 2, 3, 3), "strides": (2, 2), "pads": (1, 0, 0, 1), "dilations": (1, 1), "group": 2},
    {"x": (1, 6, 9, 9), "w": (6, 1, 3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 6},
    {"x": (1, 5, 12, 12), "w": (7, 5, 3, 2), "strides": (1, 2), "pads": (2, 1, 2, 0), "dilations": (2, 2), "group": 1},
    {"x": (1, 16, 7, 7), "w": (17, 16, 1, 1), "strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1},
    {"x": (1, 8, 8, 8), "w": (16, 8, 1, 1), "strides": (2, 2), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1},
    {"x": (2, 3, 17), "w": (4, 3, 5), "strides": (2,), "pads": (2, 1), "dilations": (1,), "group": 1},
]


@pytest.mark.parametrize("cfg", CONVS, ids=lambda c: "x".join(map(str, c["w"])) + f"_g{c['group']}")
def test_conv(cfg):
    cfg = dict(cfg)
    x, w = rnd(*cfg.pop("x")), rnd(*cfg.pop("w"), seed=1)
    bias = rnd(w.shape[0], seed=2)
    run_op("Conv", [x], consts=[w, bias], **cfg)
    run_op("Conv", [x, w], **cfg)


@pytest.mark.parametrize("act", ["none", "Relu", "Clip", "HardSwish", "Sigmoid"])
def test_fused_conv(act):
    cfg = CONVS[0]
    x, w = rnd(*cfg["x"]), rnd(*cfg["w"], seed=1)
    r = rnd(1, 8, 9, 11, seed=3)
    extra = {"act_alpha": 0.0, "act_beta": 6.0} if act == "Clip" else {}
    geo = {k: cfg[k] for k in ("strides", "pads", "dilations", "group")}
    run_op("FusedConv", [x], consts=[w, rnd(8, seed=2)], activation=act, has_bias=1, **geo, **extra)
    _fused_with_residual("FusedConv", x, w, r, geo, act, extra)


def _fused_with_residual(op, x, w, r, attrs, act, extra):
    """X, W (const), R as inputs in the op's order: X, W, R (no bias)."""
    gb = GraphBuilder("t_res")
    xi = gb.input("x", TensorType(DType.F32, x.shape))
    ri = gb.input("r", TensorType(DType.F32, r.shape))
    out = gb.add1(op, [xi, gb.constant(w, "w"), ri], activation=act, has_bias=0, has_residual=1, **attrs, **extra)
    graph = gb.build([out])
    sess = compile_graph(graph, optimize=False)
    feeds = {"x": x, "r": r}
    np.testing.assert_allclose(sess.run(feeds)[graph.outputs[0]], run_reference(graph, feeds)[graph.outputs[0]],
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("act", ["none", "Relu", "Gelu", "LeakyRelu"])
def test_fused_gemm(act):
    a, b = rnd(3, 37), rnd(19, 37, seed=1)
    extra = {"act_alpha": 0.1} if act == "LeakyRelu" else {}
    run_op("FusedGemm", [a], consts=[b, rnd(19, seed=2)], transB=1, has_bias=1, activation=act, **extra)
    _fused_with_residual("FusedGemm", a, b, rnd(3, 19, seed=4), {"transB": 1}, act, extra)


# ------------------------------------------------------------------------------------ in place ---
P = rnd(5, lo=0.5, hi=1.5)
IN_PLACE = {  # name -> (op, operands, index of the operand computed in the graph, attrs, planner aliases it)
    "batchnorm": ("BatchNormalization", [rnd(2, 5, 7, 9), P, P + 1, P - 1, P], 0, {}, True),
    "equal_bool": ("Equal", [rnd(3, 37, dtype=BOOL), rnd(3, 37, dtype=BOOL, seed=1)], 1, {}, True),
    "less_bool": ("Less", [rnd(3, 37, dtype=BOOL), rnd(37, dtype=BOOL, seed=1)], 0, {}, True),
    "greater_bool": ("Greater", [rnd(3, 37, dtype=BOOL), rnd(3, 37, dtype=BOOL, seed=1)], 0, {}, True),
    "expand_same": ("Expand", [rnd(3, 37)], 0, {"shape": (3, 37)}, True),
    "expand_broadcast": ("Expand", [rnd(1, 37)], 0, {"shape": (3, 37)}, False),
    "cast_same": ("Cast", [rnd(3, 37)], 0, {"to": DType.F32}, True),
    "where_value": ("Where", [rnd(3, 37, dtype=BOOL), rnd(3, 37, seed=1), rnd(37, seed=2)], 1, {}, True),
    "fused_conv_r": ("FusedConv", [rnd(1, 3, 9, 11), rnd(8, 3, 3, 3, seed=1), rnd(1, 8, 9, 11, seed=2)], 2,
                     {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "has_residual": 1,
                      "activation": "Relu"}, True),
    "fused_gemm_r": ("FusedGemm", [rnd(3, 37), rnd(19, 37, seed=1), rnd(19, seed=2), rnd(3, 19, seed=3)], 3,
                     {"transB": 1, "has_bias": 1, "has_residual": 1, "activation": "Clip", "act_beta": 6.0}, True),
    # A row's statistics read the whole row: the NVPTX kernels (one thread per element) could not
    # compute them in place, so the op table gives these ops no in-place rule.
    "softmax": ("Softmax", [rnd(3, 37)], 0, {}, False),
    "log_softmax": ("LogSoftmax", [rnd(3, 37)], 0, {"axis": 0}, False),
    "layer_norm": ("LayerNormalization", [rnd(3, 37), rnd(37, seed=1)], 0, {}, False),
    "fused_conv_x": ("FusedConv", [rnd(1, 8, 9, 11), rnd(8, 8, 3, 3, seed=1)], 0,
                     {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}, False),
}


@pytest.mark.parametrize("case", sorted(IN_PLACE))
def test_in_place(case):
    """The operand ``at`` is a copy made in the graph that dies at the node, so the planner hands its
    bytes to the output exactly where the op table's in-place rule allows, and the kernel is right."""
    op, operands, at, attrs, aliased = IN_PLACE[case]
    gb = GraphBuilder(f"t_in_place_{case}")
    feeds, names = {}, []
    for i, x in enumerate(operands):
        name = gb.input(f"x{i}", TensorType(DType.from_numpy(x.dtype), tuple(x.shape)))
        feeds[name] = x
        names.append(gb.add1("Identity", [name], name=f"copy{i}") if i == at else name)
    graph = gb.build([gb.add1(op, names, **attrs)])
    out = graph.outputs[0]
    assert (plan_memory(graph).aliases.get(out) == names[at]) is aliased
    got, want = compile_graph(graph, optimize=False).run(feeds)[out], run_reference(graph, feeds)[out]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


NARROW_AND_UNSIGNED = [np.int16, np.uint16, np.uint32, np.uint64]


def full_range(dtype, *shape, seed=0):
    """Values across the whole range, so a signed compare or divide on an unsigned type shows."""
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", NARROW_AND_UNSIGNED)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater"])
def test_binary_narrow_and_unsigned_ints(op, dtype):
    a, b = full_range(dtype, 3, 19), full_range(dtype, 19, seed=1)
    b[b == 0] = 3
    run_op(op, [a, b])


@pytest.mark.parametrize("dtype", NARROW_AND_UNSIGNED)
def test_cast_and_reduce_narrow_and_unsigned_ints(dtype):
    x = full_range(dtype, 3, 19)
    for dst in (F32, I64, np.uint8, dtype):
        run_op("Cast", [x], to=DType.from_numpy(dst))
    run_op("ReduceMax", [x], axes=(1,))
    run_op("ReduceMin", [x], axes=(0,))


def test_unsigned_compare_is_unsigned():
    got = compile_graph(_less_graph(np.uint32), optimize=False).run(
        {"x0": np.array([0x80000000, 1], np.uint32), "x1": np.array([1, 0x80000000], np.uint32)})
    assert got[next(iter(got))].tolist() == [False, True]


def _less_graph(dtype):
    gb = GraphBuilder("t_less")
    a = gb.input("x0", TensorType(DType.from_numpy(dtype), (2,)))
    b = gb.input("x1", TensorType(DType.from_numpy(dtype), (2,)))
    return gb.build([gb.add("Less", [a, b])[0]])


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
def test_dequantize_16_bit(dtype):
    run_op("DequantizeLinear", [full_range(dtype, 3, 19)], scale=[0.01], zero_point=[-7 if dtype == np.int16 else 7])


@pytest.mark.parametrize("to", [DType.I16, DType.U16])
def test_quantize_16_bit_saturates(to):
    x = np.array([-1e6, -300.0, -0.5, 0.5, 1.5, 2.5, 300.0, 1e6], F32)
    sess = run_op("QuantizeLinear", [x], scale=[0.01], zero_point=[3], to=to)
    info = np.iinfo(to.numpy)
    want = [info.min, max(info.min, -29997), 3 - 50 if to is DType.I16 else 0, 53, 153, 253,
            min(info.max, 30003), info.max]
    got = sess.run({"x0": x})
    assert next(iter(got.values())).tolist() == want
