"""Which layers join a job, from the graph alone, and what the plan then holds for them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cuvil.compiler.codegen.cpu.jobs import held_until, job_layout, joining_parts, own_jobs, serial_us
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target
from tests.blocks import mobilenet_block

AVX2 = resolve_target("x86-avx2")
SPLIT_ALL = dataclasses.replace(AVX2, threads=2, tuning=AVX2.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))


def test_the_pointwise_convs_input_and_output_are_held_until_the_depthwise_conv_that_joins_it():
    g, _ = mobilenet_block(residual=False)
    first, dw, last = g.nodes
    jobs = own_jobs(g, SPLIT_ALL, lambda node: True)
    assert set(jobs) == {first.name, dw.name, last.name}  # each splits (the lowering lets dw join the first)
    rows = [p.rows for p in jobs[first.name]]
    assert joining_parts(g, SPLIT_ALL, first, dw, rows) is not None
    assert joining_parts(g, SPLIT_ALL, dw, last, rows) is None  # a 1x1 conv reads every channel
    assert held_until(g, SPLIT_ALL) == {"x": 2, first.outputs[0]: 2}  # the depthwise conv runs at step 2
    assert held_until(g, dataclasses.replace(SPLIT_ALL, threads=1)) == {}


def test_the_job_layout_names_each_split_layer_and_its_ranges_and_follows_the_handoff():
    g, _ = mobilenet_block(residual=False)
    first, dw, last = g.nodes
    layout = job_layout(g, SPLIT_ALL)
    assert layout == {n: tuple(p.rows for p in parts) for n, parts in own_jobs(g, SPLIT_ALL, lambda node: True).items()}
    assert set(layout) == {first.name, dw.name, last.name} and all(len(r) == 2 for r in layout.values())
    whole = dataclasses.replace(SPLIT_ALL, tuning=SPLIT_ALL.tuning.replace(parallel_sync_ratio=2.0, parallel_sync_us=1e6))
    assert job_layout(g, whole) == {}  # no layer is worth a handoff that dear
    assert job_layout(g, dataclasses.replace(SPLIT_ALL, threads=1)) == {}


def _segmentation_head():
    """seg_bilinear's graph, optimized: split stride-2 convs, a 1x1 class conv too small to split, an 8x upsample."""
    from cuvil.compiler.frontends.torch import import_torch
    from cuvil.compiler.ir.infer import bind_batch
    from cuvil.compiler.passes.pipeline import optimize
    from tests.archs import seg_bilinear

    module, example, *_ = seg_bilinear()
    return optimize(bind_batch(import_torch(module, example), 1))


def test_a_pool_like_layer_splits_on_its_own_after_serial_layers_short_enough_that_the_workers_still_spin():
    g = _segmentation_head()
    two = dataclasses.replace(AVX2, threads=2)
    *_, classes, upsample = g.nodes
    assert (classes.op, upsample.op) == ("Conv", "Resize")
    assert serial_us(g, classes, two) == pytest.approx(21 * 16 * 16 * 64 / 100_000)  # 3.4 us at 100k a us
    jobs = own_jobs(g, two, lambda node: True)
    assert classes.name not in jobs and [p.rows for p in jobs[upsample.name]] == [(0, 11), (11, 21)]
    asleep = dataclasses.replace(two, tuning=two.tuning.replace(follower_awake_us=3.0))
    assert upsample.name not in own_jobs(g, asleep, lambda node: True)  # 3.4 us since the last job: may sleep
    assert upsample.name not in own_jobs(g, dataclasses.replace(two, threads=1), lambda node: True)


def test_the_cost_model_knows_no_time_for_ops_outside_its_rates():
    b = GraphBuilder("t")
    x = b.input("x", TensorType.parse("f32[1,4,8,8]"))
    g = b.build([b.add1("Transpose", [b.add1("Relu", [x])], perm=(0, 1, 3, 2))])
    relu, transpose = g.nodes
    assert serial_us(g, relu, AVX2) == 256 / AVX2.tuning.elementwise_elements_per_us
    assert serial_us(g, transpose, AVX2) == math.inf  # so a pool after it waits for a job before splitting alone


def test_a_layer_right_after_a_job_that_a_depthwise_conv_joined_counts_as_after_the_job():
    """MobileNetV2's projections split by pixel vectors only right after a job; the depthwise conv before each,
    too small to split alone, runs in its expansion's job, so they are (they ran whole, at 0.97-0.99x)."""
    from cuvil.compiler.frontends.torch import import_torch
    from cuvil.compiler.ir.infer import bind_batch
    from cuvil.compiler.passes.pipeline import optimize
    from tests.zoo import ZOO

    module, example = ZOO["mobilenet_v2"]()
    g = optimize(bind_batch(import_torch(module.eval(), example), 1))
    avx512 = resolve_target("x86-avx512")
    t = dataclasses.replace(avx512, threads=2, tuning=avx512.tuning.replace(parallel_sync_us=1.0))
    jobs = own_jobs(g, t, lambda node: True)
    nodes = list(g.nodes)
    after_joined = [(a, b, c) for a, b, c in zip(nodes, nodes[1:], nodes[2:])
                    if a.name in jobs and b.name not in jobs and c.name in jobs and jobs[c.name][0].after_job_only]
    assert len(after_joined) >= 3
    for a, b, _ in after_joined:
        assert joining_parts(g, t, a, b, [p.rows for p in jobs[a.name]]) is not None
