"""Which layers join a job, from the graph alone, and what the plan then holds for them."""

from __future__ import annotations

import dataclasses

import numpy as np

from cuvil.compiler.codegen.cpu.jobs import held_until, joining_parts, own_jobs
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target

AVX2 = resolve_target("x86-avx2")
SPLIT_ALL = dataclasses.replace(AVX2, threads=2, tuning=AVX2.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))


def _pointwise_then_depthwise():
    """x -> 1x1 conv 16 -> 32 -> 3x3 depthwise -> 1x1 conv 32 -> 16, at 8x8 (a MobileNetV1 pair and more)."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("pair")
    x = b.input("x", TensorType.parse("f32[1,16,8,8]"))

    def conv(v, oc, c, k, group):
        w = b.constant(rng.standard_normal((oc, c // group, k, k)).astype(np.float32))
        return b.add1("Conv", [v, w], pads=(k // 2,) * 4, strides=(1, 1), dilations=(1, 1), group=group)
    return b.build([conv(conv(conv(x, 32, 16, 1, 1), 32, 32, 3, 32), 16, 32, 1, 1)])


def test_the_pointwise_convs_input_and_output_are_held_until_the_depthwise_conv_that_joins_it():
    g = _pointwise_then_depthwise()
    first, dw, last = g.nodes
    jobs = own_jobs(g, SPLIT_ALL, lambda node: True)
    assert set(jobs) == {first.name, dw.name, last.name}  # each splits (the lowering lets dw join the first)
    rows = [p.rows for p in jobs[first.name]]
    assert joining_parts(g, SPLIT_ALL, first, dw, rows) is not None
    assert joining_parts(g, SPLIT_ALL, dw, last, rows) is None  # a 1x1 conv reads every channel
    assert held_until(g, SPLIT_ALL) == {"x": 2, first.outputs[0]: 2}  # the depthwise conv runs at step 2
    assert held_until(g, dataclasses.replace(SPLIT_ALL, threads=1)) == {}
