"""Grouped int8 convs (``quant_grouped``): row loops, one stream a tap over a plane stored by phases, a
group's outputs in vector lanes; each compiled output equal to the reference interpreter's."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, run_reference
from cuvil.edge_runtime.compile import compile_graph

from .test_quant_kernels import CONVS, FLAT_CASE, GENERIC_X86, _qconv_graph, _random_x, _target


@pytest.mark.parametrize("case", [9, FLAT_CASE])
def test_grouped_conv_by_blocks_of_outputs(monkeypatch, case):
    """A group's outputs in blocks whose int32 planes fit ACC_BYTES: here one output a block."""
    from cuvil.compiler.codegen.cpu.kernels import quant_grouped

    monkeypatch.setattr(quant_grouped, "ACC_BYTES", 1)
    dtype, _, group, stride, pads, shape, m = CONVS[case]
    rng = np.random.default_rng(case)
    w = rng.integers(-127, 128, (m, shape[1] // group, 3, 3)).astype(np.int8)
    graph = _qconv_graph(dtype, w, rng.integers(-2000, 2000, (m,)).astype(np.int32), group, stride, pads, shape)
    sess = compile_graph(graph, target=GENERIC_X86, optimize=False, use_cache=False, jobs=1)
    x = _random_x(dtype, shape, 1)
    assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])


@pytest.mark.parametrize("kind", ["host", "x86-avx2", "generic"])
@pytest.mark.parametrize("stride,dilation,pads,shape,ow", [
    (1, 2, [2, 1, 2, 3], (1, 16, 9, 12), 12),  # dilated, uneven pads
    (1, 1, [0, 0, 0, 0], (1, 16, 5, 31), 29),  # no padding: the output row as long as the plane's
    (2, 1, [1, 1, 1, 1], (2, 16, 16, 16), 8),  # stride 2: four phase blocks, two images
    (3, 2, [0, 2, 1, 0], (1, 16, 14, 17), 5),  # stride 3, dilated: the taps over every phase block
    (2, 1, [1, 0, 1, 1], (1, 16, 6, 66), 33),  # 33 wide: row by row, the plane by column phases in its rows
])
def test_grouped_conv_rows(kind, stride, dilation, pads, shape, ow):
    """Grouped convs (4 channels a group): rows under FLAT_BELOW_WIDTH as one stream over a plane stored by
    phases, wider ones row by row."""
    from cuvil.compiler.codegen.cpu.kernels.quant_grouped import FLAT_BELOW_WIDTH

    target = _target(kind)
    rng = np.random.default_rng(stride * 10 + dilation)
    w = rng.integers(-127, 128, (12, 4, 3, 3)).astype(np.int8)
    graph = _qconv_graph(DType.U8, w, rng.integers(-2000, 2000, (12,)).astype(np.int32), 4, stride, pads, shape,
                         dilation)
    assert graph.types[graph.outputs[0]].shape[3] == ow and (ow < FLAT_BELOW_WIDTH) == (ow != 33)
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    for seed in range(2):
        x = _random_x(DType.U8, shape, seed)
        assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])


@pytest.mark.parametrize("kind", ["host", "x86-avx2", "generic"])
@pytest.mark.parametrize("w_shape,group,stride,dilation,pads,shape,bias", [
    ((16, 8, 3, 3), 2, 2, 1, [1, 1, 1, 1], (2, 16, 8, 8), True),  # 8 outputs a group, 4x4 from 8x8: a stream of 19
    ((12, 4, 3, 3), 2, 1, 2, [2, 0, 1, 2], (1, 8, 5, 6), False),  # 6 outputs a group in a 6-lane vector; dilated
])
def test_grouped_conv_outputs_in_lanes(monkeypatch, kind, w_shape, group, stride, dilation, pads, shape, bias):
    """Grouped convs whose taps' streams are short: a group's outputs in the lanes of one vector."""
    from cuvil.compiler.codegen.cpu.kernels import quant_grouped

    target, taken, lanes = _target(kind), [], quant_grouped._grouped_lanes
    monkeypatch.setattr(quant_grouped, "_grouped_lanes", lambda ctx, *a: taken.append(1) or lanes(ctx, *a))
    rng = np.random.default_rng(w_shape[0])
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    b = rng.integers(-2000, 2000, (w_shape[0],)).astype(np.int32) if bias else None
    graph = _qconv_graph(DType.I8, w, b, group, stride, pads, shape, dilation)
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    assert taken
    for seed in range(2):
        x = _random_x(DType.I8, shape, seed)
        assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])
