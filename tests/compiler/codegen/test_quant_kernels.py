"""Quant kernels: compiled int8 output equals the reference interpreter exactly, for every quad
dot-product variant this host can run, and the generated code uses each ISA's integer dot product."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.codegen.cpu.int_dot import choose_dot
from cuvil.compiler.codegen.cpu.kernels.base import KernelKey
from cuvil.compiler.codegen.cpu.kernels.quant_rows import WIDENED
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.target import Target
from cuvil.devices.detect import resolve_target
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import compile_graph, runnable_here
from tests.hosts import HOST, executable

from .test_kernels import run_op

GENERIC_X86 = Target("x86-generic", "x86_64-unknown-linux-gnu", "x86-64", (), 128)


def _vnni256() -> Target:
    """The x86-avx512-vnni profile on ymm registers (no -prefer-256-bit): vpdpbusd with AVX-512 VL."""
    t = resolve_target("x86-avx512-vnni")
    return dataclasses.replace(t, name="x86-avx512-vnni-256", vector_bits=256,
                               features=tuple(f for f in t.features if f != "-prefer-256-bit"))


def _target(kind: str) -> Target:
    if kind == "host":
        return HOST
    if kind == "generic":
        return GENERIC_X86
    if kind == "vnni-256":
        t = _vnni256()
        if not runnable_here(t):
            pytest.skip(f"AVX-512 VNNI code does not run on this host ({HOST.cpu}); runs on Intel Cascade Lake or "
                        "newer Xeons and AMD Zen 4")
        return t
    if kind == "amx":
        t = resolve_target("x86-amx")
        if not runnable_here(t):
            pytest.skip(f"AMX-INT8 code does not run on this host ({HOST.cpu}); runs on Intel Sapphire Rapids or "
                        "newer Xeons (test_amx_code_is_generated checks the code everywhere)")
        return t
    return executable(kind)


def _qconv_graph(x_dtype, w, bias, group, stride, pads, x_shape, dilation=1):
    gb = GraphBuilder("qconv")
    x = gb.input("x", TensorType(x_dtype, x_shape))
    inputs = [x, gb.constant(w, "w")] + ([gb.constant(bias, "b")] if bias is not None else [])
    m = w.shape[0]
    ws = np.linspace(0.004, 0.02, m).astype(np.float32)
    y = gb.add1("QConv", inputs, strides=[stride, stride], pads=pads, dilations=[dilation, dilation], group=group, x_scale=0.05,
                x_zero_point=9 if x_dtype is DType.U8 else -3, w_scale=ws, y_scale=0.3,
                y_zero_point=100 if x_dtype is DType.U8 else 4, to=x_dtype, clamp=[2, 120])
    return gb.build([y])


def _random_x(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if dtype is DType.U8 else (-128, 128)
    return rng.integers(lo, hi, shape).astype(dtype.numpy)


CONVS = [  # (x dtype, weight bound, group, stride, pads, x shape, out channels)
    (DType.U8, 127, 1, 1, [1, 1, 1, 1], (2, 5, 9, 9), 11),  # odd pixels and channels: every tail of the im2col GEMM
    (DType.I8, 127, 1, 2, [0, 1, 1, 0], (1, 8, 9, 8), 16),
    (DType.U8, 64, 1, 1, [0, 0, 0, 0], (1, 12, 6, 6), 24),  # bounded pairs: vpmaddubsw on AVX2
    (DType.U8, 127, 4, 1, [1, 1, 1, 1], (1, 8, 5, 5), 8),  # grouped: direct loops
    (DType.U8, 127, 8, 2, [1, 1, 1, 1], (1, 8, 9, 11), 8),  # depthwise, stride 2: taps summed in registers
    (DType.I8, 127, 4, 1, [1, 0, 0, 1], (2, 4, 6, 7), 8),  # depthwise with two outputs per input channel
    (DType.I8, 127, 21, 1, [1, 0, 2, 1], (1, 21, 5, 6), 21),  # depthwise, small plane: channels in lanes, a tail
    (DType.U8, 127, 40, 2, [1, 1, 1, 1], (2, 40, 7, 7), 40),  # depthwise, stride 2, small plane: channels in lanes
    (DType.U8, 127, 3, 2, [1, 0, 1, 2], (1, 3, 27, 26), 3),  # depthwise, stride 2, large plane: column phases
    # (x86: channels in lanes, its output rows being 13 wide)
    (DType.I8, 127, 2, 3, [2, 1, 0, 1], (1, 4, 10, 11), 6),  # grouped, stride 3: column phases
    (DType.U8, 128, 1, 1, [1, 1, 1, 1], (1, 20, 9, 9), 21),  # AVX2: Winograd F(2x2, 3x3), odd plane, channel tails
    (DType.I8, 128, 1, 1, [0, 2, 1, 0], (2, 32, 10, 17), 12),  # AVX2: Winograd, uneven pads, two images, signed blocks
    (DType.U8, 127, 1, 1, [1, 1, 1, 1], (2, 5, 4, 5), 21),  # 20 pixels: channels in lanes, no padding products; an
    # odd channel (AVX2's int16 pairs), 3 channel vectors (AVX2: a tile of two, then one)
    (DType.U8, 128, 1, 1, [1, 1, 1, 1], (1, 20, 20, 20), 21),  # AVX2 Winograd: 100 tiles, a block of 84 and a tail; the
    # input transposed by 16 channels x 16 columns, 4 columns and 4 channels left over; an even plane: a tile row's
    # two outputs stored as one 16-bit word per channel, 5 output channels in the last vector
    (DType.I8, 127, 20, 1, [1, 1, 1, 1], (1, 20, 3, 3), 20),  # depthwise, 3x3 plane: channels in lanes on every target
    (DType.U8, 127, 16, 1, [1, 1, 1, 1], (1, 16, 25, 5), 16),  # depthwise, 125 pixels 5 wide: x86 without byte
    # quads keeps channels in lanes
    (DType.I8, 127, 16, 2, [1, 1, 1, 1], (1, 16, 9, 70), 16),  # depthwise, stride 2, 35 wide: column phases on x86
    (DType.U8, 127, 8, 1, [1, 1, 1, 1], (2, 8, 6, 37), 8),  # depthwise, 37 wide: at 256 bits two steps of 16 columns
    # by tap pairs and a step of 5
    (DType.U8, 127, 40, 2, [1, 1, 1, 1], (2, 40, 34, 33), 40),  # depthwise, stride 2, 17 wide: x86 channels in lanes,
    # the plane copied by 16 channels x 16 columns a group of 16 channels at a time, a group of 8 last, two images
    (DType.I8, 127, 4, 1, [0, 2, 1, 1], (2, 32, 8, 9), 32),  # grouped, 8 channels a group, 7x10 outputs, uneven pads,
    # two images
]
GROUPS_OF_8 = len(CONVS) - 1
WINOGRAD_CASES = (10, 11, 13)
ROWS_CASES = (1, 12)  # x86-avx2, int16 pairs: planes of at most 64 pixels, k x k, one group (2: vpmaddubsw)


@pytest.mark.parametrize("kind", ["host", "x86-avx2", "generic", "x86-avx512", "x86-avx512-vnni", "vnni-256", "amx"])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_qconv_is_exact(kind, case):
    dtype, bound, group, stride, pads, shape, m = CONVS[case]
    target = _target(kind)
    rng = np.random.default_rng(case)
    w = rng.integers(-bound, min(bound + 1, 128), (m, shape[1] // group, 3, 3)).astype(np.int8)
    bias = rng.integers(-2000, 2000, (m,)).astype(np.int32) if case != 1 else None
    graph = _qconv_graph(dtype, w, bias, group, stride, pads, shape)
    if kind == "x86-avx2":
        llvm_ir = lower(graph, target, optimize=False).llvm_ir
        assert ("winograd" in llvm_ir) == (case in WINOGRAD_CASES)
        assert (f'"{WIDENED}' in llvm_ir) == (case in ROWS_CASES)  # int8 weights widened as loaded
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    for seed in range(2):
        x = _random_x(dtype, shape, seed)
        got, want = sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]]
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("kind", ["host", "x86-avx2", "x86-avx512", "x86-avx512-vnni", "generic"])
@pytest.mark.parametrize("side", [2, 3, 4])
def test_1x1_convs_on_planes_that_leave_gemm_lanes_empty_run_transposed(kind, side):
    """A 1x1 QConv whose pixels fill at most ``int8_rows_1x1_max_fill`` of the GEMM's pixel vectors runs
    transposed (at x86-avx2, 8 lanes: 2x2 and 3x3 do, 4x4 does not), and equals the reference either way
    (the transposed kernel reads the channel units at the plane's pitch, not the GEMM's padded one)."""
    target = _target(kind)
    rng = np.random.default_rng(side)
    w = rng.integers(-127, 128, (37, 40, 1, 1)).astype(np.int8)
    bias = rng.integers(-2000, 2000, (37,)).astype(np.int32)
    graph = _qconv_graph(DType.U8, w, bias, 1, 1, [0, 0, 0, 0], (1, 40, side, side))
    if kind == "x86-avx2":
        assert (f'"{WIDENED}' in lower(graph, target, optimize=False).llvm_ir) == (side < 4)
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    x = _random_x(DType.U8, (1, 40, side, side), side)
    assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])


@pytest.mark.parametrize("kind", ["host", "x86-avx2", "generic"])
@pytest.mark.parametrize("to,zp,clamp", [(DType.U8, 7, [0, 255]), (DType.I8, -3, [-128, 127]), (DType.U8, 100, [102, 120])])
def test_requantization_rounds_ties_to_even_and_saturates_like_the_reference(kind, to, zp, clamp):
    """QAdd with multipliers 0.5 and 0.25 puts every value on a quarter: half of them are ties, rounded to even
    before an odd zero point is added (rounding after it would move them); the rest run past both clamps."""
    target = _target(kind)
    gb = GraphBuilder("qadd")
    a, b = gb.input("a", TensorType(DType.U8, (4, 256))), gb.input("b", TensorType(DType.U8, (4, 256)))
    y = gb.add1("QAdd", [a, b], a_scale=0.5, a_zero_point=128, b_scale=0.25, b_zero_point=3, y_scale=1.0,
                y_zero_point=zp, to=to, clamp=clamp)
    graph = gb.build([y])
    xa = np.tile(np.arange(256, dtype=np.uint8), (4, 1))
    xb = np.stack([np.roll(np.arange(256, dtype=np.uint8), k * 37) for k in range(4)])
    got = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1).run({"a": xa, "b": xb})[y]
    want = run_reference(graph, {"a": xa, "b": xb})[y]
    assert np.array_equal(got, want)
    exact = np.clip(np.rint((xa.astype(np.float64) - 128) * 0.5 + (xb.astype(np.float64) - 3) * 0.25) + zp, *clamp)
    assert np.array_equal(want.astype(np.float64), exact)  # the reference itself: half to even, then the zero point


@pytest.mark.parametrize("kind", ["host", "x86-avx2", "x86-avx512-vnni"])
@pytest.mark.parametrize("k,stride,pads,shape", [(1, 2, [0, 0, 0, 0], (1, 16, 40, 46)), (3, 1, [1, 1, 1, 1], (1, 16, 20, 23))])
def test_int8_convs_split_over_threads_equal_the_reference(kind, k, stride, pads, shape):
    """At 2 and 3 threads (every layer worth a part): the im2col GEMM's parts of output rows (each its rows'
    im2col, writing its rows of every channel: 20 rows in 2 and 3 parts) or of channels, the same
    bytes as 1 thread and the reference."""
    base = _target(kind)
    base = dataclasses.replace(base, tuning=base.tuning.replace(parallel_sync_us=0.0))
    w = np.random.default_rng(k).integers(-127, 128, (24, 16, k, k)).astype(np.int8)
    graph = _qconv_graph(DType.U8, w, np.arange(24, dtype=np.int32) * 37 - 400, 1, stride, pads, shape)
    x = _random_x(DType.U8, shape, k)
    want = run_reference(graph, {"x": x})[graph.outputs[0]]
    for threads in (1, 2, 3):
        sess = compile_graph(graph, target=base, threads=threads, optimize=False, use_cache=False, jobs=1)
        assert sess.lowered.split_nodes == (threads > 1)
        assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], want), threads


@pytest.mark.parametrize("side,winograd", [(7, True), (6, False)])
def test_winograd_before_the_transposed_kernel_from_16_tiles(side, winograd):
    """At x86-avx2 a 3x3 conv on a plane both could take runs by Winograd from 16 output tiles (7x7:
    4x4 tiles), transposed on int8 weights widened as loaded below (6x6: 9 tiles)."""
    w = np.random.default_rng(0).integers(-127, 128, (12, 16, 3, 3)).astype(np.int8)
    llvm_ir = lower(_qconv_graph(DType.I8, w, None, 1, 1, [1, 1, 1, 1], (1, 16, side, side)), resolve_target("x86-avx2"),
                    optimize=False).llvm_ir
    assert ("winograd" in llvm_ir) == winograd and (f'"{WIDENED}' in llvm_ir) == (not winograd)


@pytest.mark.parametrize("blocks", [0, 2])
def test_winograd_gemm_prefetches_its_weights_as_tuned(blocks):
    """The AVX2 Winograd GEMM walks its int16 weights a row of V at a time: it prefetches later
    column blocks unless ``int8_winograd_prefetch_blocks`` is 0."""
    t = resolve_target("x86-avx2")
    t = dataclasses.replace(t, tuning=t.tuning.replace(int8_winograd_prefetch_blocks=blocks))
    w = np.random.default_rng(0).integers(-127, 128, (32, 16, 3, 3)).astype(np.int8)
    llvm_ir = lower(_qconv_graph(DType.U8, w, None, 1, 1, [1, 1, 1, 1], (1, 16, 8, 8)), t, optimize=False).llvm_ir
    assert "winograd" in llvm_ir and ("llvm.prefetch" in llvm_ir) == (blocks > 0)


@pytest.mark.parametrize("kind,rows", [("host", 0), ("host", 64), ("x86-avx2", 0), ("x86-avx2", 64)])
@pytest.mark.parametrize("stride,dilation,pads", [(1, 2, [2, 3, 0, 4]), (3, 1, [2, 0, 1, 5]), (2, 3, [0, 4, 3, 0])])
def test_qconv_padding_edges(kind, rows, stride, dilation, pads):
    """Taps whose columns lie partly or wholly in the padding: the im2col's in-bounds spans, and
    (``int8_rows_max_pixels`` 64) the channels-in-lanes kernel's per-pixel valid taps and sums."""
    rng = np.random.default_rng(stride)
    shape = (1, 5, 6, 4)
    w = rng.integers(-127, 128, (6, 5, 3, 3)).astype(np.int8)
    graph = _qconv_graph(DType.U8, w, None, 1, stride, pads, shape, dilation)
    target = _target(kind)
    target = dataclasses.replace(target, tuning=target.tuning.replace(int8_rows_max_pixels=rows))
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    x = _random_x(DType.U8, shape, 3)
    assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])


def test_int8_rows_keep_to_6x6_planes_on_cores_with_two_512_bit_fmas_a_cycle():
    """Zen 5 (``tuning.INT8_ROWS_MAX_PIXELS_FULL_RATE``): an int8 3x3 conv to 8x8 or 7x7 runs the im2col GEMM, one
    to 6x6 keeps channels in lanes; a Zen 4 keeps all three in lanes (the rows kernel's pixel-order tables, ``.pxN``)."""
    vnni = resolve_target("x86-avx512-vnni")
    zen4, zen5 = (Target(cpu, vnni.triple, cpu, vnni.features, 512) for cpu in ("znver4", "znver5"))
    w = np.random.default_rng(0).integers(-127, 128, (32, 16, 3, 3)).astype(np.int8)
    for side, rows_on_zen5 in ((8, False), (7, False), (6, True)):
        graph = _qconv_graph(DType.U8, w, None, 1, 1, [1, 1, 1, 1], (1, 16, side, side))
        rows = [re.search(r"\.px\d", lower(graph, t, optimize=False).llvm_ir) is not None for t in (zen4, zen5)]
        assert rows == [True, rows_on_zen5], side


@pytest.mark.parametrize("kind,bound,dtype,c,kernel,stride,dilation,pads,width,taps", [
    ("x86-avx512-vnni", 127, DType.U8, 1, (1, 9), 3, 1, [0, 4, 0, 3], 301, True),  # 1-D: 9 taps in 3 quads, borders
    ("x86-avx512-vnni", 127, DType.I8, 3, (2, 5), 2, 1, [1, 2, 0, 1], 60, True),  # 15 pairs in 4 quads, 2 rows
    ("x86-avx512-vnni", 127, DType.U8, 2, (3, 7), 1, 2, [1, 5, 2, 6], 40, True),  # dilated, pads wider than taps
    ("x86-avx2", 127, DType.U8, 1, (1, 9), 3, 1, [0, 4, 0, 3], 301, True),  # int16 pairs: 9 taps in 5 pairs
    ("x86-avx2", 127, DType.I8, 3, (2, 5), 2, 1, [1, 2, 0, 1], 60, False),  # 3 channels fill a pair: per channel
    ("x86-avx2", 64, DType.I8, 3, (2, 5), 2, 1, [1, 2, 0, 1], 60, True),  # bounded pairs: vpmaddubsw quads
])
def test_few_channels_share_units_across_taps(kind, bound, dtype, c, kernel, stride, dilation, pads, width, taps):
    """Fewer input channels than a unit (an audio front conv): a kernel row's neighbouring taps fill
    the unit instead of zero-point channels, and the result stays the reference's."""
    target = _target(kind)
    rng = np.random.default_rng(c)
    w = rng.integers(-bound, min(bound + 1, 128), (11, c, *kernel)).astype(np.int8)
    shape = (2, c, 7 if kernel[0] > 1 else 1, width)
    graph = _qconv_graph(dtype, w, rng.integers(-900, 900, (11,)).astype(np.int32), 1, stride, pads, shape, dilation)
    assert ("qtaps" in lower(graph, target, optimize=False).llvm_ir) == taps
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    x = _random_x(dtype, shape, 7)
    assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])


@pytest.mark.parametrize("kind", ["x86-avx512-vnni", "vnni-256"])
@pytest.mark.parametrize("dtype,stride,dilation,pads,shape", [
    (DType.U8, 1, 2, [2, 1, 0, 3], (1, 3, 12, 37)),  # rows of 3 chunks, the last partial; dilated
    (DType.I8, 2, 1, [0, 1, 1, 0], (2, 4, 30, 35)),  # stride 2 rows, two images; activations re-encoded
    (DType.U8, 3, 1, [1, 2, 2, 1], (1, 5, 9, 10)),  # a small plane as runs across its rows
    (DType.I8, 1, 3, [3, 3, 3, 3], (1, 2, 7, 6)),  # dilated runs; the plane's last run partial
    (DType.U8, 1, 1, [1, 1, 1, 1], (1, 2, 60, 3)),  # rows narrower than a vector: no spill past the next row
])
def test_depthwise_window_rows(kind, dtype, stride, dilation, pads, shape):
    """Depthwise convs above a 3x3 plane on byte-quad targets: one quad dot product per window row."""
    target = _target(kind)
    c = shape[1]
    rng = np.random.default_rng(c)
    w = rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)
    graph = _qconv_graph(dtype, w, rng.integers(-900, 900, (c,)).astype(np.int32), c, stride, pads, shape, dilation)
    assert "dwrows" in lower(graph, target, optimize=False).llvm_ir
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    x = _random_x(dtype, shape, 5)
    assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])


@pytest.mark.parametrize("kind", ["x86-avx512-vnni", "vnni-256", "x86-avx2"])
@pytest.mark.parametrize("dtype,k,stride,dilation,pads,ceil,shape", [
    (DType.U8, 3, 2, 1, [0, 0, 0, 0], 1, (1, 3, 27, 27)),  # SqueezeNet's: ceil mode, a small plane as runs
    (DType.I8, 3, 1, 1, [1, 1, 1, 1], 0, (2, 4, 9, 10)),  # padded: the border is the lowest int8
    (DType.U8, 2, 2, 1, [0, 1, 1, 0], 1, (1, 2, 40, 37)),  # rows, a partial last vector
    (DType.I8, 3, 2, 2, [2, 0, 1, 2], 1, (1, 2, 15, 14)),  # dilated, uneven pads
])
def test_int8_max_pool_by_byte_shuffles(kind, dtype, k, stride, dilation, pads, ceil, shape):
    target = _target(kind)
    gb = GraphBuilder("pool")
    x = gb.input("x", TensorType(dtype, shape))
    y = gb.add1("MaxPool", [x], kernel_shape=[k, k], strides=[stride, stride], dilations=[dilation, dilation],
                pads=pads, ceil_mode=ceil)
    graph = gb.build([y])
    assert "bytepool" in lower(graph, target, optimize=False).llvm_ir
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    xv = _random_x(dtype, shape, 7)
    assert np.array_equal(sess.run({"x": xv})[y], run_reference(graph, {"x": xv})[y])


@pytest.mark.parametrize("kind", ["host", "x86-avx2", "generic", "x86-avx512-vnni", "amx"])
@pytest.mark.parametrize("a_dtype,k,n,bias", [(DType.U8, 37, 21, True), (DType.I8, 64, 16, False),
                                              (DType.U8, 130, 40, True)])
@pytest.mark.parametrize("float_out", [False, True])
def test_qmatmul_is_exact(kind, a_dtype, k, n, bias, float_out):
    """Requantized to i8, or the float-output form (float32 results: equal bit for bit as well)."""
    target = _target(kind)
    rng = np.random.default_rng(k)
    gb = GraphBuilder("qmm")
    a = gb.input("a", TensorType(a_dtype, (2, 11, k)))  # 22 rows: on AMX one full tile and 6 rows more
    inputs = [a, gb.constant(rng.integers(-127, 128, (k, n)).astype(np.int8), "b")]
    if bias:
        inputs.append(gb.constant(rng.integers(-900, 900, (n,)).astype(np.int32), "c"))
    out = dict(y_scale=1.0, y_zero_point=0, to=DType.F32) if float_out else dict(y_scale=0.2, y_zero_point=-5,
                                                                                   to=DType.I8)
    y = gb.add1("QMatMul", inputs, a_scale=0.04, a_zero_point=7, b_scale=np.linspace(0.01, 0.02, n), **out)
    graph = gb.build([y])
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    x = _random_x(a_dtype, (2, 11, k), 1)
    got, want = sess.run({"a": x})[y], run_reference(graph, {"a": x})[y]
    assert got.dtype == want.dtype == (np.float32 if float_out else np.int8)
    assert np.array_equal(got, want)


def test_qmatmul_with_weights_at_run_time_and_qadd_and_qdq():
    rng = np.random.default_rng(5)
    a, b = _random_x(DType.U8, (3, 10), 1), rng.integers(-128, 128, (10, 4)).astype(np.int8)
    run_op("QMatMul", [a, b], a_scale=0.1, a_zero_point=3, b_scale=[0.05], y_scale=0.5, y_zero_point=1, to=DType.U8)
    x, y = _random_x(DType.U8, (2, 3, 17), 2), _random_x(DType.I8, (3, 1), 3)
    run_op("QAdd", [x, y], a_scale=0.1, a_zero_point=128, b_scale=0.07, b_zero_point=-2, y_scale=0.12,
           y_zero_point=3, to=DType.U8, clamp=[3, 250])
    f = rng.standard_normal((2, 3, 5, 7)).astype(np.float32) * 4
    f[0, 0, 0, :3] = [np.nan, np.inf, 0.5]
    for axis, scale, zp in ((1, [0.02, 0.03, 0.05], [1, 128, 255]), (-1, [0.1], [0])):
        run_op("QuantizeLinear", [f], scale=scale, zero_point=zp, axis=axis, to=DType.U8)
        q = _random_x(DType.I8, (2, 3, 5, 7), 4)
        run_op("DequantizeLinear", [q], scale=scale, zero_point=[z - 128 for z in zp], axis=axis)
    run_op("DequantizeLinear", [rng.integers(-1 << 20, 1 << 20, (6,)).astype(np.int32)], scale=[1e-4], zero_point=[0])


@pytest.mark.parametrize("profile,bounded,want", [
    ("x86-avx2", True, ("vpmaddubsw", "vpmaddwd")), ("x86-avx2", False, ("vpmaddwd",)),
    ("vnni-256", False, ("vpdpbusd",)), ("x86-avx512-vnni", False, ("vpdpbusd\t%zmm",)), ("alderlake", False, ("{vex}\tvpdpbusd",)), ("rpi5", False, ("sdot",)),
])
def test_generated_code_uses_the_isa_dot_product(profile, bounded, want):
    if profile == "vnni-256":
        target = _vnni256()
    elif profile == "alderlake":  # AVX-VNNI (VEX encoded), no AVX-512
        target = dataclasses.replace(resolve_target("x86-avx2"), name="avx-vnni", cpu="alderlake",
                                     features=resolve_target("x86-avx2").features + ("+avxvnni",))
    else:
        target = resolve_target(profile)
    bound = 64 if bounded else 127
    w = np.random.default_rng(0).integers(-bound, bound + 1, (16, 8, 3, 3)).astype(np.int8)
    graph = _qconv_graph(DType.U8, w, None, 1, 1, [1, 1, 1, 1], (1, 8, 8, 8))
    asm = jit.emit_assembly(lower(graph, target, optimize=False).llvm_ir, target)
    for mnemonic in want:
        assert mnemonic in asm, f"{mnemonic} missing from the {target.name} QConv"
    assert choose_dot(target, bounded).kind in {"vnni", "avx2-ubsw", "avx2-wd", "sdot"}


def test_amx_code_is_generated():
    """x86-amx: convs (signed weights x unsigned activations) and matmuls (the reverse) on tiles, with
    row and K remainders (37 output channels, K = 180 bytes; 21 rows, K = 132 bytes); a matmul of fewer
    rows than a tile holds (batch 1) and a conv of fewer weights per output than ``amx_min_depth`` keep to
    vpdpbusd."""
    from cuvil.compiler.codegen.cpu.amx import tile_config

    target = resolve_target("x86-amx")
    assert choose_dot(target, False).kind == "amx"
    w = np.random.default_rng(0).integers(-127, 128, (37, 20, 3, 3)).astype(np.int8)
    asm = jit.emit_assembly(lower(_qconv_graph(DType.U8, w, None, 1, 1, [1, 1, 1, 1], (1, 20, 7, 9)), target,
                                  optimize=False).llvm_ir, target)
    assert "tdpbsud" in asm and "ldtilecfg" in asm and "tilerelease" in asm
    for depth in (target.tuning.amx_min_depth, target.tuning.amx_min_depth - 1, 16):  # a conv's weights per output
        shallow = np.ones((37, depth, 1, 1), np.int8)
        asm = jit.emit_assembly(lower(_qconv_graph(DType.U8, shallow, None, 1, 1, [0, 0, 0, 0], (1, depth, 7, 9)),
                                      target, optimize=False).llvm_ir, target)
        tiles = depth >= target.tuning.amx_min_depth
        assert ("tdpbsud" in asm) == tiles and (tiles or "vpdpbusd" in asm), depth
    for rows, tiles in ((21, True), (target.tuning.amx_min_rows - 1, False), (1, False)):
        gb = GraphBuilder("qmm")
        a = gb.input("a", TensorType(DType.U8, (rows, 130)))
        y = gb.add1("QMatMul", [a, gb.constant(np.ones((130, 40), np.int8), "b")], a_scale=0.04, a_zero_point=7,
                    b_scale=[0.01], y_scale=0.2, y_zero_point=-5, to=DType.I8)
        asm = jit.emit_assembly(lower(gb.build([y]), target, optimize=False).llvm_ir, target)
        assert ("tdpbusd" in asm) == tiles and (tiles or "vpdpbusd" in asm), rows
    cfg = tile_config(row_rem=5, k_rem=3)  # palette 1; tiles 0-2 full, 3: 16 x 12 B, 4: 3 x 64 B, 5-6: 5 x 64 B, 7: 5 x 12 B
    colsb = np.frombuffer(cfg[16:48], "<u2")
    assert cfg[0] == 1 and list(colsb[:8]) == [64, 64, 64, 12, 64, 64, 64, 12] and not colsb[8:].any()
    assert list(cfg[48:56]) == [16, 16, 16, 16, 3, 5, 5, 5] and not any(cfg[56:])


def test_gpu_kernels_use_dp4a_and_equal_the_reference(tmp_path):
    import shutil

    from cuvil.compiler.codegen.nvptx import gpu_target, lower_ptx

    from .gpu_sim import SimulatedGpu
    from .test_nvptx import ptxas

    rng = np.random.default_rng(9)
    gb = GraphBuilder("qgpu")
    x = gb.input("x", TensorType(DType.F32, (1, 6, 5, 5)))
    q = gb.add1("QuantizeLinear", [x], scale=[0.03], zero_point=[120], to=DType.U8)
    conv = dict(strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], x_scale=0.03, x_zero_point=120, y_scale=0.2,
                y_zero_point=10, to=DType.U8)
    c1 = gb.add1("QConv", [q, gb.constant(rng.integers(-127, 128, (6, 6, 3, 3)).astype(np.int8), "w1"),
                           gb.constant(rng.integers(-99, 99, (6,)).astype(np.int32), "b1")], w_scale=[0.01] * 6, **conv)
    c2 = gb.add1("QConv", [q, gb.constant(rng.integers(-127, 128, (6, 2, 3, 3)).astype(np.int8), "w2")], group=3,
                 w_scale=[0.02], **conv)
    s = gb.add1("QAdd", [c1, c2], a_scale=0.2, a_zero_point=10, b_scale=0.2, b_zero_point=10, y_scale=0.3,
                y_zero_point=0, to=DType.U8, clamp=[0, 255])
    f = gb.add1("Flatten", [s], axis=1)
    w3 = gb.constant(rng.integers(-127, 128, (150, 7)).astype(np.int8), "w3")
    mm = gb.add1("QMatMul", [f, w3], a_scale=0.3, a_zero_point=0, b_scale=[0.01], y_scale=0.5, y_zero_point=128,
                 to=DType.U8)
    y = gb.add1("DequantizeLinear", [mm], scale=[0.5], zero_point=[128])
    logits = gb.add1("QMatMul", [f, w3], a_scale=0.3, a_zero_point=0, b_scale=[0.01], y_scale=1.0, to=DType.F32)
    graph = gb.build([y, logits])
    feeds = {"x": rng.standard_normal((1, 6, 5, 5)).astype(np.float32)}
    program = lower_ptx(graph, gpu_target("qgpu", "sm_87"))
    ptx = jit.emit_assembly(program.llvm_ir, program.target)
    assert "dp4a.u32.s32" in ptx
    if shutil.which("ptxas"):
        done = ptxas(ptx, "sm_87", tmp_path)
        assert done.returncode == 0, done.stderr[:2000]
    got, want = SimulatedGpu(program).run(feeds), run_reference(graph, feeds)
    assert np.array_equal(got[y], want[y])
    assert got[logits].dtype == np.float32 and np.array_equal(got[logits], want[logits])  # the float-output form


@pytest.mark.parametrize("profile,shape,stride,lanes", [
    ("x86-avx2", (1, 16, 25, 5), 1, True),  # 5 wide: the row loops fill a third of a vector
    ("x86-avx2", (1, 16, 12, 12), 1, True),
    ("x86-avx2", (1, 16, 16, 16), 1, False),  # from 16 wide the row loops win
    ("x86-avx2", (1, 16, 48, 48), 2, True),  # 24 wide at stride 2
    ("x86-avx2", (1, 16, 9, 70), 2, False),  # 35 wide at stride 2: column phases
    ("x86-avx512", (1, 16, 25, 5), 1, True),
    ("x86-avx512", (1, 16, 12, 12), 1, False),  # at 512 bits the row loops win from 12 wide
    ("x86-avx512", (1, 16, 48, 48), 2, True),
    ("rpi5", (1, 16, 25, 5), 1, False),  # byte quads (sdot): window rows
])
def test_depthwise_channels_in_lanes_by_output_width(profile, shape, stride, lanes):
    """A 3x3 depthwise QConv whose plane is over ``int8_depthwise_lanes_max_pixels`` keeps channels in
    lanes where the window-row quads cannot take it and its output rows are short (x86's
    ``int8_depthwise_lanes_max_width``, ``..._strided``)."""
    from cuvil.compiler.codegen.cpu.kernels.quant import _pack_qconv
    from cuvil.compiler.codegen.cpu.kernels.quant_depthwise import LANES

    c = shape[1]
    graph = _qconv_graph(DType.U8, np.ones((c, 1, 3, 3), np.int8), np.zeros(c, np.int32), c, stride, [1, 1, 1, 1], shape)
    node = graph.nodes[0]
    key = KernelKey(node.op, tuple(sorted(node.attr.items())), tuple(graph.types[i] for i in node.inputs),
                    tuple(graph.types[o] for o in node.outputs), (None,) * 3, (), (None, "const", "const"))
    packed = _pack_qconv(key, 1, graph.constants[node.inputs[1]], resolve_target(profile))
    assert (packed is not None and packed[0] == LANES) == lanes


@pytest.mark.parametrize("kind", ["x86-avx2", "x86-avx512-vnni"])
@pytest.mark.parametrize("prefetch", [False, True])
def test_the_conv_gemm_prefetches_the_next_tiles_weight_rows_as_tuned(kind, prefetch):
    """A 1x1 int8 conv over 16 pixels is the im2col GEMM with the weights broadcast, MR rows a tile: with
    ``int8_prefetch_weight_rows`` each tile prefetches the next tile's rows, and the answer is the same."""
    t = _target(kind)
    t = dataclasses.replace(t, tuning=t.tuning.replace(int8_prefetch_weight_rows=prefetch))
    w = np.random.default_rng(1).integers(-127, 128, (48, 64, 1, 1)).astype(np.int8)
    graph = _qconv_graph(DType.U8, w, np.arange(48, dtype=np.int32) * 11 - 200, 1, 1, [0, 0, 0, 0], (1, 64, 4, 4))
    lowered = lower(graph, t, optimize=False)
    assert ("llvm.prefetch" in lowered.llvm_ir) == prefetch
    x = _random_x(DType.U8, (1, 64, 4, 4), 5)
    got = compile_graph(graph, target=t, optimize=False, use_cache=False, jobs=1).run({"x": x})[graph.outputs[0]]
    assert np.array_equal(got, run_reference(graph, {"x": x})[graph.outputs[0]])


def test_only_x86_targets_prefetch_the_conv_gemms_weight_rows():
    assert resolve_target("x86-avx2").tuning.int8_prefetch_weight_rows
    assert not resolve_target("rpi5").tuning.int8_prefetch_weight_rows  # never timed on Arm
