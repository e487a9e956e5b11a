"""The VNNI int8 conv that reads its taps in place (``quant_direct.py``): exact against the reference
interpreter on every tail (odd channel counts, rows not a whole number of vectors, wide rows split
into pieces, remainder rows and channel blocks, strides, dilations, uneven padding, extreme values),
and chosen only where the profile's tuning says (VNNI, wide enough output rows)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.codegen.cpu.int_dot import Dot
from cuvil.compiler.codegen.cpu.kernels.base import KernelKey
from cuvil.compiler.codegen.cpu.kernels.quant_direct import ACC_NAME, direct_plan, even_rows, kernel_row_sums, padded_rows
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.devices.detect import resolve_target
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import compile_graph
from tests.hosts import executable

from .test_quant_kernels import _target


def _graph(x_dtype, w, bias, stride, pads, x_shape, dilation=1, x_zp=None):
    gb = GraphBuilder("qconv_direct")
    x = gb.input("x", TensorType(x_dtype, x_shape))
    inputs = [x, gb.constant(w, "w")] + ([gb.constant(bias, "b")] if bias is not None else [])
    m = w.shape[0]
    signed = x_dtype is DType.I8
    y = gb.add1("QConv", inputs, strides=[stride, stride], pads=pads, dilations=[dilation, dilation], group=1,
                x_scale=0.05, x_zero_point=x_zp if x_zp is not None else (-3 if signed else 9),
                w_scale=np.linspace(0.004, 0.02, m).astype(np.float32), y_scale=0.3,
                y_zero_point=4 if signed else 100, to=x_dtype, clamp=[-128, 127] if signed else [0, 255])
    return gb.build([y])


CASES = [  # (x dtype, stride, dilation, pads, x shape, out channels, kernel)
    (DType.U8, 1, 1, [1, 1, 1, 1], (1, 8, 32, 32), 16, 3),  # whole vectors, two rows a tile
    (DType.U8, 1, 1, [1, 1, 1, 1], (2, 5, 20, 20), 11, 3),  # odd channels (a quad of 1), a partial vector, two images
    (DType.I8, 1, 1, [0, 2, 1, 3], (1, 7, 9, 35), 23, 3),  # uneven pads, 3 vectors a row, remainder rows
    (DType.U8, 2, 1, [1, 1, 1, 1], (1, 12, 33, 34), 13, 3),  # stride 2: column and row phases
    (DType.I8, 2, 1, [1, 0, 2, 1], (1, 13, 37, 40), 19, 3),  # stride 2, uneven pads
    (DType.U8, 1, 2, [2, 2, 2, 2], (1, 6, 10, 21), 9, 3),  # dilated
    (DType.U8, 3, 2, [3, 1, 0, 4], (1, 9, 14, 57), 7, 3),  # stride 3 and dilation 2: taps across phases
    (DType.U8, 1, 1, [2, 2, 2, 2], (1, 4, 6, 75), 10, 5),  # 5x5, 75 wide: pieces of a row (5 vectors: 3 + 2)
    (DType.I8, 1, 1, [0, 1, 0, 1], (1, 17, 5, 16), 33, (1, 3)),  # a 1x3 kernel, 17 channels, 33 outputs
]


@pytest.mark.parametrize("kind", ["x86-avx512-vnni", "vnni-256"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_direct_qconv_is_exact(kind, case):
    dtype, stride, dilation, pads, shape, m, k = CASES[case]
    kh, kw = (k, k) if isinstance(k, int) else k
    target = _target(kind)
    target = dataclasses.replace(target, tuning=target.tuning.replace(int8_direct_min_lane_use=0.0))  # partial vectors
    rng = np.random.default_rng(case)
    w = rng.integers(-128, 128, (m, shape[1], kh, kw)).astype(np.int8)
    bias = rng.integers(-5000, 5000, (m,)).astype(np.int32) if case % 2 == 0 else None
    graph = _graph(dtype, w, bias, stride, pads, shape, dilation)
    assert f'"{ACC_NAME}' in lower(graph, target, optimize=False).llvm_ir
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    for seed in range(2):
        x = np.random.default_rng(seed).integers(-128 if dtype is DType.I8 else 0, 128 if dtype is DType.I8 else 256,
                                                 shape).astype(dtype.numpy)
        got, want = sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]]
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("dtype,x_zp", [(DType.U8, 0), (DType.U8, 255), (DType.I8, -128), (DType.I8, 127)])
def test_direct_qconv_extreme_values(dtype, x_zp):
    """Activations at both ends of their range against weights at both ends (-128, 127), zero points
    at the ends too (the padding's fill byte): the int32 sums and the saturation are the reference's."""
    target = executable("x86-avx512-vnni")
    shape, m = (1, 13, 18, 17), 6
    lo, hi = (0, 255) if dtype is DType.U8 else (-128, 127)
    w = np.where(np.arange(m * 13 * 9).reshape(m, 13, 3, 3) % 3 == 0, -128, 127).astype(np.int8)
    w[1] = -128
    w[2] = 127
    graph = _graph(dtype, w, None, 1, [1, 1, 1, 1], shape, x_zp=x_zp)
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    rng = np.random.default_rng(7)
    seen = set()
    for x in (np.full(shape, lo), np.full(shape, hi), np.where(rng.random(shape) < 0.5, lo, hi)):
        x = x.astype(dtype.numpy)
        got, want = sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]]
        assert np.array_equal(got, want)
        seen |= set(np.unique(want).tolist())
    assert {lo, hi} <= seen  # both saturation bounds reached


@pytest.mark.parametrize("profile,width,tuned,lane_use,chosen", [
    ("x86-avx512-vnni", 16, 16, 1.0, True), ("x86-avx512-vnni", 15, 16, 0.0, False),
    ("x86-avx512-vnni", 32, 0, 1.0, False), ("x86-avx512-vnni", 8, 8, 0.5, True),
    ("x86-avx512-vnni", 8, 8, 1.0, False),
    ("x86-avx512-vnni", 20, 16, 1.0, False), ("x86-avx512-vnni", 20, 16, 0.6, True),
    ("x86-avx512-vnni", 48, 16, 1.0, True),
    ("x86-avx2", 32, 16, 1.0, False), ("x86-avx512", 32, 16, 1.0, False), ("x86-amx", 32, 16, 1.0, False),
])
def test_direct_qconv_chosen_as_tuned(profile, width, tuned, lane_use, chosen):
    """Only on ``vpdpbusd`` (not AMX's tiles, not AVX2 or AVX-512 without VNNI), from
    ``int8_direct_min_width`` output columns (0: never) whose rows fill ``int8_direct_min_lane_use``
    of their vectors (20 columns: 62.5% of two zmm); planes of at most ``int8_rows_max_pixels`` keep
    the channels-in-lanes kernel."""
    t = resolve_target(profile)
    t = dataclasses.replace(t, tuning=t.tuning.replace(int8_direct_min_width=tuned, int8_rows_max_pixels=0,
                                                       int8_direct_min_lane_use=lane_use))
    w = np.random.default_rng(0).integers(-128, 128, (16, 8, 3, 3)).astype(np.int8)
    llvm_ir = lower(_graph(DType.U8, w, None, 1, [1, 1, 1, 1], (1, 8, 4, width)), t, optimize=False).llvm_ir
    assert (f'"{ACC_NAME}' in llvm_ir) == chosen


def test_direct_qconv_code_broadcasts_weight_quads():
    """x86-avx512-vnni: the tile's steps are ``vpdpbusd`` on zmm; the profile default takes a 32x32 plane."""
    t = resolve_target("x86-avx512-vnni")
    assert t.tuning.int8_direct_min_width == 16
    w = np.random.default_rng(0).integers(-128, 128, (64, 64, 3, 3)).astype(np.int8)
    llvm_ir = lower(_graph(DType.U8, w, None, 1, [1, 1, 1, 1], (1, 64, 32, 32)), t, optimize=False).llvm_ir
    assert f'"{ACC_NAME}' in llvm_ir
    asm = jit.emit_assembly(llvm_ir, t)
    assert "vpdpbusd\t" in asm and "%zmm" in asm


@pytest.mark.parametrize("hw,stride,dilation,pads,want", [
    (32, 1, 1, (1, 1, 1, 1), {0: (0,), 1: (), 30: (), 31: (2,)}),  # ResNet-18's: one kernel row at each edge
    (32, 2, 1, (1, 1, 1, 1), {0: (0,), 1: (), 15: ()}),  # stride 2: the last row reads the image's last row
    (14, 3, 2, (3, 1, 4, 4), {0: (0, 1), 1: (), 4: (), 5: (1, 2)}),  # stride 3, dilation 2: rows 3 oy - 3 + (0, 2, 4)
])
def test_padded_kernel_rows(hw, stride, dilation, pads, want):
    """Which kernel rows of an output row read only padding (those products are skipped)."""
    oh = (hw + pads[0] + pads[2] - 2 * dilation - 1) // stride + 1
    ow = (20 + pads[1] + pads[3] - 2 * dilation - 1) // stride + 1
    attrs = (("dilations", (dilation, dilation)), ("group", 1), ("pads", pads), ("strides", (stride, stride)))
    key = KernelKey("QConv", attrs, (TensorType(DType.U8, (1, 4, hw, 20)), TensorType(DType.I8, (4, 4, 3, 3))),
                    (TensorType(DType.U8, (1, 4, oh, ow)),), (None, None), (), (None, "const"))
    plan = direct_plan(key, Dot("vnni", 16))
    assert {oy: padded_rows(plan, oy) for oy in want} == want


def test_kernel_row_sums():
    w = np.arange(-54, 54).reshape(2, 3, 3, 6).astype(np.int8)  # [M, C, KH, KW]
    want = np.array([[sum(int(w[m, c, ty, tx]) for c in range(3) for tx in range(6)) for ty in range(3)]
                     for m in range(2)])
    assert np.array_equal(kernel_row_sums(w), want)


@pytest.mark.parametrize("m, most, rows", [(64, 6, 4), (60, 6, 6), (10, 6, 5), (11, 6, 6), (7, 3, 3), (9, 1, 1)])
def test_a_register_tile_takes_channels_that_divide_the_layers(m, most, rows):
    """The most channels down to just over half of them that divide ``m``; else the most (with a
    shorter last tile)."""
    assert even_rows(m, most) == rows
