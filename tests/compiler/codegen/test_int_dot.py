"""The AVX2 quad dot products at their bounds: ``vpmaddubsw`` only where no int16 pair sum can
saturate (``|w0| + |w1| <= 128``: 255 * 128 = 32640 < 2^15), and exact there with the extreme values
(every activation 255, weight pairs at +-128); one pair past the bound takes ``vpmaddwd`` instead."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.codegen.cpu.int_dot import choose_dot, pairs_bounded
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.devices.detect import resolve_target
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import compile_graph
from tests.hosts import executable


@pytest.mark.parametrize("pair,bounded", [
    ((64, 64), True), ((-64, -64), True), ((63, -64), True), ((0, -128), True), ((-128, 0), True),
    ((65, 64), False), ((-64, -65), False), ((127, 2), False), ((-128, 1), False),
])
def test_pairs_bounded_is_the_int16_saturation_bound(pair, bounded):
    """255 * (|w0| + |w1|) fits int16 up to 128 (32640), not at 129 (32895 > 32767)."""
    assert (255 * (abs(pair[0]) + abs(pair[1])) <= 32767) is bounded
    rows = np.array([[1, -1, pair[0], pair[1]], [0, 0, 5, 5]], np.int8)
    assert pairs_bounded(rows) is bounded
    assert pairs_bounded(np.array([[-128]], np.int8))  # an odd K: the last weight's pair is 0


def _extreme_weights(m: int, c: int, k: int, top: int) -> np.ndarray:
    """Channel pairs (the pairs ``vpmaddubsw`` sums) at ``|w0| + |w1| = 2 top``: with four or more
    channels, pairs of +top next to pairs of -(top - 1) (so a tap's sum is small: a saturated pair would
    show), the negation, and (top, -top); with two channels, the taps alternate (top, top) and
    (-(top - 1), -(top - 1))."""
    w = np.empty((m, c, k * k), np.int64)
    for o in range(m):
        if c >= 4:
            w[o] = np.resize([top, top, 1 - top, 1 - top], c)[:, None] * [1, -1][o % 2]
            if o % 3 == 2:
                w[o] = np.resize([top, -top], c)[:, None]
        else:
            w[o] = np.where(np.arange(k * k) % 2 == 0, top, 1 - top)[None, :]
    return w.reshape(m, c, k, k).astype(np.int8)


def _qconv(w: np.ndarray, x_shape: tuple, stride: int, pad: int):
    """y = 128 + sum * mult with ``mult`` = 100 / (a bound on any output's |sum|): nothing clamps,
    and the small sums leave a saturated pair (an error of 127 or more) visible in the bytes."""
    m = w.shape[0]
    gb = GraphBuilder("qconv_extremes")
    x = gb.input("x", TensorType(DType.U8, x_shape))
    per_tap = np.abs(w.astype(np.int64).reshape(m, w.shape[1], -1).sum(axis=1)).sum(axis=1)  # [m]
    mult = float(100 / (255 * max(1, per_tap.max())))
    y = gb.add1("QConv", [x, gb.constant(w, "w")], strides=[stride, stride], pads=[pad] * 4, dilations=[1, 1],
                group=1, x_scale=1.0, x_zero_point=0, w_scale=np.full(m, mult, np.float32), y_scale=1.0,
                y_zero_point=128, to=DType.U8, clamp=[0, 255])
    return gb.build([y])


CASES = [  # (x shape, kernel, stride, pad): each AVX2 u8 x s8 path of a one-group QConv
    ((1, 8, 4, 4), 3, 1, 1),  # a small plane, 3x3: channels in lanes (quant_rows)
    ((1, 8, 12, 12), 3, 2, 1),  # im2col GEMM, broadcast weight rows
    ((1, 16, 9, 9), 1, 1, 0),  # 1x1: the channel quads are the GEMM's operand
    ((1, 2, 10, 10), 3, 1, 1),  # fewer channels than a quad: taps share units (quant_taps)
]


@pytest.mark.parametrize("x_shape,k,stride,pad", CASES)
@pytest.mark.parametrize("top,kind", [(64, "avx2-ubsw"), (65, "avx2-wd")])
def test_avx2_extremes_are_exact(x_shape, k, stride, pad, top, kind):
    """All-255 activations against pairs summing to +-128 (the bound: vpmaddubsw) and to +-129 (past
    it: the packer takes vpmaddwd): the compiled x86-avx2 conv equals the reference exactly."""
    target = executable("x86-avx2")
    w = _extreme_weights(12, x_shape[1], k, top)
    assert choose_dot(target, pairs_bounded(w.reshape(12, -1))).kind == kind
    graph = _qconv(w, x_shape, stride, pad)
    asm = jit.emit_assembly(lower(graph, resolve_target("x86-avx2")).llvm_ir, target)
    assert ("vpmaddubsw" in asm) is (kind == "avx2-ubsw") and "vpmaddwd" in asm
    x = np.full(x_shape, 255, np.uint8)
    want = run_reference(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    got = compile_graph(graph, target=target, threads=1, use_cache=False).run({graph.inputs[0]: x})[graph.outputs[0]]
    assert 0 < want.min() and want.max() < 255, "the sums must not clamp, or a saturated pair could hide"
    np.testing.assert_array_equal(got, want)
