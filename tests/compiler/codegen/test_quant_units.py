"""Packed int8 weights carry their requantization multipliers: layers that differ only in their
scales, and the equal parts of a split layer, share one function, and each still computes its own
output exactly."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.devices.detect import resolve_target
from cuvil.edge_runtime.compile import compile_graph
from tests.hosts import executable


def _chain(scales: list[tuple[object, float]], group: int = 1, c: int = 16):
    """QConvs of ``c`` -> ``c`` channels, 3x3 on 8x8, one after another, the i-th with w_scale and
    y_scale ``scales[i]``; zero points and shapes alike."""
    rng = np.random.default_rng(5)
    gb = GraphBuilder("chain")
    v = gb.input("x", TensorType(DType.U8, (1, c, 8, 8)))
    for i, (w_scale, y_scale) in enumerate(scales):
        w = gb.constant(rng.integers(-127, 128, (c, c // group, 3, 3)).astype(np.int8), f"w{i}")
        b = gb.constant(rng.integers(-3000, 3000, (c,)).astype(np.int32), f"b{i}")
        v = gb.add1("QConv", [v, w, b], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=group, x_scale=0.05,
                    x_zero_point=7, w_scale=w_scale, y_scale=y_scale, y_zero_point=7, to=DType.U8, clamp=[])
    return gb.build([v])


def _qconv_functions(graph, target) -> int:
    text = lower(graph, target, optimize=False).llvm_ir
    return len(re.findall(r"^define[^@]*@\"?k[0-9a-f]+_QConv", text, flags=re.M))


def _exact(graph, target) -> None:
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 8, 8)).astype(np.uint8)
    got = compile_graph(graph, target=target, optimize=False, use_cache=False, tune=False, threads=target.threads)
    want = run_reference(graph, {"x": x})[graph.outputs[0]]
    assert np.array_equal(got.run({"x": x})[graph.outputs[0]], want)


PER_CHANNEL = [(np.linspace(0.004, 0.02, 16).astype(np.float32), 0.3),
               (np.linspace(0.03, 0.001, 16).astype(np.float32), 0.5),
               ((0.01,), 0.2)]  # a per-tensor scale too: carried as one row each


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512-vnni", "rpi5"])
def test_convs_that_differ_only_in_scales_share_one_function(profile):
    assert _qconv_functions(_chain(PER_CHANNEL), resolve_target(profile)) == 1


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512-vnni"])
def test_each_conv_requantizes_with_its_own_scales(profile):
    _exact(_chain(PER_CHANNEL), executable(profile))


def test_grouped_convs_keep_their_scales_in_the_code_and_stay_exact():
    """Grouped convs (not depthwise) are not packed: nothing carries their multipliers."""
    graph = _chain(PER_CHANNEL[:2], group=4)
    target = executable("x86-avx2")
    assert _qconv_functions(graph, target) == 2
    _exact(graph, target)


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512-vnni"])
def test_the_equal_parts_of_a_split_conv_share_one_function(profile):
    base = executable(profile)
    split = dataclasses.replace(base, threads=2, tuning=base.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    graph = _chain(PER_CHANNEL[:1])  # 16 output channels: two parts of 8
    assert lower(graph, split, optimize=False).split_nodes == 1
    assert _qconv_functions(graph, split) == 1
    _exact(graph, split)
