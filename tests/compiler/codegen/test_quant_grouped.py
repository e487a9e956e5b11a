"""Grouped int8 convs by ``quant_grouped``'s planes (those with constant weights and two or more channels a
group are split into a conv a group by the pipeline, so these compile unoptimized), each compiled output
equal to the reference interpreter's."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, run_reference
from cuvil.edge_runtime.compile import compile_graph

from .test_quant_kernels import CONVS, GROUPS_OF_8, GENERIC_X86, _qconv_graph, _random_x, _target


@pytest.mark.parametrize("case", [9, GROUPS_OF_8])
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
    (1, 1, [0, 0, 0, 0], (1, 16, 5, 31), 29),  # no padding
    (2, 1, [1, 1, 1, 1], (2, 16, 16, 16), 8),  # stride 2, two images
    (3, 2, [0, 2, 1, 0], (1, 16, 14, 17), 5),  # stride 3, dilated
    (2, 1, [1, 0, 1, 1], (1, 16, 6, 66), 33),  # 33 wide
])
def test_grouped_conv_rows(kind, stride, dilation, pads, shape, ow):
    """Grouped convs (4 channels a group) at strides 1-3, dilated, narrow and wide rows."""
    target = _target(kind)
    rng = np.random.default_rng(stride * 10 + dilation)
    w = rng.integers(-127, 128, (12, 4, 3, 3)).astype(np.int8)
    graph = _qconv_graph(DType.U8, w, rng.integers(-2000, 2000, (12,)).astype(np.int32), 4, stride, pads, shape,
                         dilation)
    assert graph.types[graph.outputs[0]].shape[3] == ow
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    for seed in range(2):
        x = _random_x(DType.U8, shape, seed)
        assert np.array_equal(sess.run({"x": x})[graph.outputs[0]], run_reference(graph, {"x": x})[graph.outputs[0]])
