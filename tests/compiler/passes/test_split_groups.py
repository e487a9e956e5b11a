"""split_groups: an int8 conv of wide groups becomes a conv a group, with the same integers out."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, Node, TensorType, run_reference
from cuvil.compiler.ir.types import N
from cuvil.compiler.passes import split_groups
from cuvil.compiler.passes.split_groups import MIN_GROUP_CHANNELS
from cuvil.edge_runtime.compile import compile_graph
from tests.hosts import HOST

from .graphs import graph, ops


def _qconv(cg: int, group: int, mg: int, per_channel: bool, bias: bool, stride: int = 1):
    rng = np.random.default_rng(cg * group)
    m, c = mg * group, cg * group
    consts = {"w": rng.integers(-127, 128, (m, cg, 3, 3)).astype(np.int8)}
    consts |= {"b": rng.integers(-3000, 3000, (m,)).astype(np.int32)} if bias else {}
    scales = [float(np.float32(s)) for s in np.linspace(0.002, 0.01, m if per_channel else 1)]
    node = Node.make("QConv", ["x", *consts], ["y"], strides=[stride, stride], pads=[1, 0, 1, 2], dilations=[1, 1],
                     group=group, x_scale=0.05, x_zero_point=3, w_scale=scales, y_scale=0.2, y_zero_point=-4,
                     to=DType.I8, clamp=[-128, 127])
    return graph({"x": TensorType(DType.I8, (N, c, 7, 9))}, consts, [node], ["y"])


@pytest.mark.parametrize("cg, group, mg, per_channel, bias, stride", [
    (16, 3, 16, True, True, 1),  # RegNetY's: as many outputs as inputs a group
    (24, 2, 5, False, False, 2),  # one scale for all, no bias, 5 outputs a group, stride 2
])
def test_wide_groups_become_a_conv_a_group_with_the_same_integers(cg, group, mg, per_channel, bias, stride):
    before = _qconv(cg, group, mg, per_channel, bias, stride)
    after = split_groups(before)
    assert ops(after) == ["Split"] + ["QConv"] * group + ["Concat"]
    assert all(n.attr["group"] == 1 for n in after.nodes if n.op == "QConv")
    x = np.random.default_rng(7).integers(-128, 128, (2, cg * group, 7, 9)).astype(np.int8)
    want = run_reference(before, {"x": x})["y"]
    assert np.array_equal(run_reference(after, {"x": x})["y"], want)
    sess = compile_graph(before, target=HOST, batch=2, use_cache=False, jobs=1)  # the pipeline splits it, then compiles
    assert np.array_equal(sess.run({"x": x})["y"], want)


def test_narrow_groups_and_run_time_weights_stay_whole():
    narrow = _qconv(MIN_GROUP_CHANNELS - 1, 2, 4, True, True)
    assert split_groups(narrow) is narrow
    wide = _qconv(MIN_GROUP_CHANNELS, 2, 4, True, False)
    node = wide.nodes[0]
    given = graph({"x": wide.types["x"], "w": TensorType(DType.I8, (8, MIN_GROUP_CHANNELS, 3, 3))}, {}, [node], ["y"])
    assert split_groups(given) is given
