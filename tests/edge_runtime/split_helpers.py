"""What the split-check tests share: a two-conv model, its inputs, a target that splits every layer,
verdicts to hand a compile, and the tuner's probe and timing stubbed out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target
from cuvil.edge_runtime import split_check

AVX2 = resolve_target("x86-avx2")  # runs on every build host
SPLIT_ALL = dataclasses.replace(AVX2, tuning=AVX2.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))


def convs(seed: int, channels=((8, 32), (32, 32))):
    """Convs of these (in, out) channels over 12x12; ``seed`` draws the weights (a model's versions)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("two_convs")
    x = b.input("x", TensorType.parse("f32[1,8,12,12]"))
    for c, oc in channels:
        w = b.constant(rng.standard_normal((oc, c, 3, 3)).astype(np.float32))
        x = b.add1("Conv", [x, w], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
    return b.build([x])


@pytest.fixture(scope="module")
def graph():
    return convs(1)


@pytest.fixture
def feeds(graph):
    return {graph.inputs[0]: np.random.default_rng(2).standard_normal((1, 8, 12, 12)).astype(np.float32)}


@pytest.fixture
def no_probe(monkeypatch):
    """The tuner's handoff probe and kernel timing are not what these tests are about."""
    from cuvil.edge_runtime import autotune, pool_probe

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: 1.0)
    monkeypatch.setattr(autotune, "tune", lambda graph, target, llvm=None, known=None: autotune.TuneReport((), 0, 0.0, 0.0))


def verdict(split: bool, settled: bool = True) -> split_check.Verdict:
    """A verdict on free cores when ``settled``, else one without them."""
    return split_check.Verdict(split, settled, f"{'split' if split else 'whole'} (a test's verdict)", measured=settled)


def split_verdict(speedup: float) -> split_check.Verdict:
    """A split that paid on free cores, running ``speedup`` times its serial run."""
    return split_check.Verdict(True, True, "split (a test's verdict)", saving_s=1e-4, speedup=speedup)
