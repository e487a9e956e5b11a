"""Which layers join a job, from the graph alone, and what the plan then holds for them."""

from __future__ import annotations

import dataclasses

from cuvil.compiler.codegen.cpu.jobs import held_until, job_layout, joining_parts, own_jobs
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
