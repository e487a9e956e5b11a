"""Threads under qemu: ARM64 NEON and SVE2 code with its worker pool, the same bits as at one thread.

The harness starts the model's workers (pthreads of the statically linked C library) before the
first example and joins them after the last; every layer that can split is split (``parallel_sync_ratio`` 0).
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")

from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from cuvil.devices import resolve_target  # noqa: E402
from cuvil.edge_runtime.emulated import EmulatedModel  # noqa: E402
from tests.archs import ARCHS  # noqa: E402
from tests.int8_zoo import int8_model  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                       reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]
MODELS = {"mlp": ZOO["mlp"], "small_cnn": ZOO["small_cnn"], "kws_dscnn": ARCHS["kws_dscnn"],
          "tiny_transformer": ZOO["tiny_transformer"]}  # GEMMs by rows, heads, elementwise ops


@pytest.mark.parametrize("profile,bits", [("rpi5", None), ("arm64-sve2", 256)])
@pytest.mark.parametrize("name", list(MODELS))
def test_emulated_outputs_are_the_same_bits_at_1_2_and_3_threads(name, profile, bits, tmp_path):
    model, example = MODELS[name]()
    graph = import_torch(model, example)
    rng = np.random.default_rng(3)
    examples = [{n: rng.standard_normal(tuple(x.shape)).astype(np.float32) for n, x in zip(graph.inputs, example)}
                for _ in range(3)]
    base = resolve_target(profile)
    base = dataclasses.replace(base, tuning=base.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    outs = {}
    for threads in (1, 2, 3):
        em = EmulatedModel(graph, dataclasses.replace(base, threads=threads), use_cache=False, workdir=tmp_path)
        assert (em.lowered.split_nodes > 0) == (threads > 1)
        outs[threads] = em.run(examples, bits)
    for threads in (2, 3):
        for one, other in zip(outs[1], outs[threads]):
            for key in one:
                assert one[key].tobytes() == other[key].tobytes(), f"{key} differs at {threads} threads"


@pytest.mark.parametrize("profile,bits", [("rpi5", None), ("arm64-sve2", 256), ("jetson-xavier", None)])
@pytest.mark.parametrize("name", ["small_cnn", "mlp"])
def test_emulated_int8_outputs_are_the_same_bits_at_1_and_2_threads(name, profile, bits, tmp_path):
    """The int8 small CNN's integer convs split by output channels, the MLP's fully connected layers by
    columns: NEON and SVE `sdot`, and a core without dot products (Xavier's Carmel)."""
    model = int8_model(name)
    examples = [{model.int8.inputs[0]: model.inputs(1, seed)} for seed in range(2)]
    base = resolve_target(profile)
    base = dataclasses.replace(base, tuning=base.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    outs = {}
    for threads in (1, 2):
        em = EmulatedModel(model.int8, dataclasses.replace(base, threads=threads), use_cache=False, workdir=tmp_path)
        assert (em.lowered.split_nodes > 0) == (threads > 1)
        outs[threads] = em.run(examples, bits)
    for one, two in zip(outs[1], outs[2]):
        assert all(one[k].tobytes() == two[k].tobytes() for k in one)
