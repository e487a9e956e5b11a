"""Native ConvTranspose and Resize kernels against the reference interpreter (``test_nvptx`` re-runs
them on the simulated GPU)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ops.registry import ShapeError
from cuvil.edge_runtime.compile import compile_graph

from tests.compiler.codegen.test_kernels import rnd, run_op
from tests.hosts import executable

CONVT = [  # x shape, w shape, attrs
    ((1, 3, 7), (3, 2, 3), dict(strides=[2], pads=[1, 0], dilations=[1], output_padding=[1])),
    ((2, 4, 5, 6), (4, 3, 3, 2), dict(strides=[2, 3], pads=[1, 1, 0, 2], dilations=[1, 2], output_padding=[0, 1], group=2)),
    ((1, 2, 3, 4, 5), (2, 2, 2, 2, 3), dict(strides=[1, 2, 2], pads=[0] * 6, dilations=[1, 1, 1], output_padding=[0, 0, 0])),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs, ws, attrs", CONVT)
def test_conv_transpose(xs, ws, attrs, bias):
    x, w = rnd(*xs, seed=1), rnd(*ws, seed=2)
    consts = [w] + ([rnd(ws[1] * attrs.get("group", 1), seed=3)] if bias else [])
    run_op("ConvTranspose", [x], consts, **attrs)


def test_conv_transpose_f16_and_f64():
    attrs = CONVT[1][2]
    for dtype in (np.float16, np.float64):
        run_op("ConvTranspose", [rnd(*CONVT[1][0], seed=4).astype(dtype), rnd(*CONVT[1][1], seed=5).astype(dtype)], **attrs)


RESIZE = [
    dict(mode="nearest"),
    dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="ceil"),
    dict(mode="linear"),
    dict(mode="linear", coordinate_transformation_mode="align_corners"),
    dict(mode="linear", antialias=1),
    dict(mode="cubic"),
    dict(mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5),
    dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", roi=(0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3),
         extrapolation_value=7.0),
]


@pytest.mark.parametrize("scales", [(1.0, 1.0, 2.0, 1.5), (1.0, 1.0, 0.5, 0.7), (1.0, 1.0, 2.0, 1.0),
                                    (1.0, 1.0, 1.0, 3.0), (1.0, 2.0, 2.0, 1.0)])
@pytest.mark.parametrize("attrs", RESIZE, ids=str)
def test_resize(attrs, scales):
    """Both last axes, one of them (the plane kernel, ``kernels/resize.py``) or a leading one too (per element)."""
    x = rnd(2, 3, 6, 5, seed=6)
    sizes = [int(np.floor(s * n)) for s, n in zip(scales, x.shape)]
    run_op("Resize", [x], sizes=sizes, scales=scales, **attrs)


@pytest.mark.parametrize("shape, scales", [((7, 4), (3.0, 0.5)), ((3, 5, 8), (1.0, 2.0, 2.0)),
                                           ((1, 64, 16, 16), (1.0, 1.0, 2.0, 2.0))])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_planes_of_any_rank(shape, scales, mode):
    """The plane kernel at rank 2, 3 and 4; a nearest resize is a copy, so its values are the very input's."""
    x = rnd(*shape, seed=8)
    gb = GraphBuilder("r")
    name = gb.input("x", TensorType(DType.F32, shape))
    graph = gb.build([gb.add1("Resize", [name], sizes=[int(np.floor(s * n)) for s, n in zip(scales, shape)],
                              scales=list(scales), mode=mode)])
    (got,), (want,) = compile_graph(graph, optimize=False).run({"x": x}).values(), run_reference(graph, {"x": x}).values()
    if mode == "nearest":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.uint8])
def test_resize_dtypes(dtype):
    x = rnd(1, 2, 3, 4, dtype=dtype, seed=7, lo=0, hi=9)
    mode = "linear" if np.dtype(dtype).kind == "f" else "nearest"
    run_op("Resize", [x], sizes=[-1, -1, 5, 9], scales=[1.0, 1.0, 5 / 3, 9 / 4], mode=mode)


GRID = [dict(mode=m, padding_mode=p, align_corners=c)
        for m in ("nearest", "linear", "cubic") for p in ("zeros", "border", "reflection") for c in (0, 1)]


@pytest.mark.parametrize("attrs", GRID, ids=str)
def test_grid_sample(attrs):
    """Coordinates well outside [-1, 1] (every padding rule), a NaN and infinities in the grid."""
    x = rnd(2, 3, 5, 4, seed=8)
    grid = rnd(2, 6, 7, 2, seed=9, lo=-2.5, hi=2.5)
    grid[0, 0, 0] = [np.nan, 0.3]
    grid[1, 2, 3] = [np.inf, -np.inf]
    run_op("GridSample", [x, grid], **attrs)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_grid_sample_volumetric(mode, dtype):
    x = rnd(1, 2, 3, 4, 5, dtype=dtype, seed=10)
    run_op("GridSample", [x, rnd(1, 2, 3, 4, 3, dtype=dtype, seed=11, lo=-1.2, hi=1.2)], mode=mode,
           padding_mode="reflection", align_corners=0)


I64 = np.iinfo(np.int64)
EXACT = np.array([I64.max, I64.max - 1, I64.min, 2**62 + 1], np.int64)
"""Values a float64 cannot hold: an integer Resize must copy them, not round them through floats."""
F = object()
"""Where the expected row has the fill (the extrapolation value, rounded and saturated)."""
INTEGER_RESIZE = [  # attrs, fill, expected positions (index into EXACT, F for the fill, None for 0)
    (dict(coordinate_transformation_mode="tf_crop_and_resize", roi=(0, 0, 0, -0.5, 1, 1, 1, 1.5)), 1e30,
     [F, F, 0, 1, 2, 3, F, F]),
    (dict(coordinate_transformation_mode="half_pixel", nearest_mode="floor"), 0.0, [None, 0, 0, 1, 1, 2, 2, 3]),
]


def _integer_resize_cases():
    for attrs, ev, where in INTEGER_RESIZE:
        for x, fill in ((EXACT, I64.max), (EXACT.astype(np.uint64), 2**64 - 1),
                        (np.array([2**31 - 1, -2**31, 7, -7], np.int32), 2**31 - 1),
                        (np.array([True, False, True, False]), True)):
            dtype, fill = x.dtype, fill if ev else 0
            want = [fill if w is F else 0 if w is None else x[w] for w in where]
            yield dict(attrs, extrapolation_value=ev), x.reshape(1, 1, 1, 4), np.array(want, dtype).reshape(1, 1, 1, 8)


def _integer_resize_graph(attrs, x):
    gb = GraphBuilder("t_int_resize")
    name = gb.input("x", TensorType(DType.from_numpy(x.dtype), x.shape))
    return gb.build([gb.add1("Resize", [name], sizes=[-1, -1, -1, 8], scales=[1.0, 1.0, 1.0, 2.0], mode="nearest",
                             exclude_outside=1, **attrs)])


@pytest.mark.parametrize("profile", ["host", "x86-avx2", "x86-avx512"])
def test_integer_resize_copies_values_exactly(profile):
    """Rows whose one tap exclude_outside drops are 0, outside rows the saturated extrapolation value,
    the rest the input's values bit for bit (2^63 - 1 came back as -2^63 through a float64, and
    uint64's maximum as 0 in the reference)."""
    target = executable(profile)
    for attrs, x, want in _integer_resize_cases():
        graph = _integer_resize_graph(attrs, x)
        got = compile_graph(graph, target=target, use_cache=False).run({"x": x})[graph.outputs[0]]
        np.testing.assert_array_equal(got, want, err_msg=f"{x.dtype} {attrs}")
        np.testing.assert_array_equal(run_reference(graph, {"x": x})[graph.outputs[0]], want, err_msg="reference")


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                    reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")
def test_integer_resize_copies_values_exactly_on_arm64(tmp_path):
    from cuvil.edge_runtime.emulated import EmulatedModel

    for attrs, x, want in _integer_resize_cases():
        graph = _integer_resize_graph(attrs, x)
        em = EmulatedModel(graph, "rpi5", use_cache=False, workdir=tmp_path)
        try:
            (got,) = em.run([{"x": x}])
        finally:
            em.close()
        np.testing.assert_array_equal(got[graph.outputs[0]], want, err_msg=f"{x.dtype} {attrs}")


def test_integer_resize_refuses_a_nan_fill():
    with pytest.raises(ShapeError, match="extrapolation_value must be a number"):
        _integer_resize_graph(dict(coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=np.nan),
                              np.zeros((1, 1, 1, 4), np.int32))
