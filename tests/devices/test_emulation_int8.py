"""The zoo in int8 under qemu: compiled int8 output equals the int8 reference interpreter exactly
(integer arithmetic is exact) on SVE2 at 128 and 512 bits and on NEON-only CPU models with dotprod
(``sdot`` present in the object code of both) and without it (Jetson Xavier: widened multiply-adds),
and with i8mm (Graviton4 at 128 and 512 bits: ``smmla`` in the object code); the SVE2 build's GEMMs
are SVE ``sdot`` (one vector-length agnostic build run at both lengths)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from cuvil.compiler import run_reference
from cuvil.devices.isa_report import from_object
from cuvil.edge_runtime.emulated import EmulatedModel

pytest.importorskip("torch")
from tests.int8_zoo import CNN_AND_MLP, int8_model  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                       reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]
SLOW = {"resnet18", "mobilenet_v2"}
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CNN_AND_MLP]
PROFILES = {"arm64-sve2": (128, 512), "graviton4": (128, 512), "rpi5": (None,), "jetson-orin": (None,),
            "jetson-xavier": (None,)}
DOTPROD = {"arm64-sve2", "graviton4", "rpi5", "jetson-orin"}
I8MM = {"graviton4"}
SVE_SDOT = {"arm64-sve2"}  # scalable without i8mm: vector-length agnostic SVE sdot


@pytest.mark.parametrize("name", MODELS)
def test_zoo_int8_is_exact_under_qemu(name, tmp_path):
    m = int8_model(name)
    count = 1 if name in SLOW else 3
    xs = m.inputs(count, seed=11)
    examples = [{m.int8.inputs[0]: xs[i:i + 1]} for i in range(count)]
    want = [run_reference(m.int8, ex)[m.int8.outputs[0]] for ex in examples]
    for profile, lengths in PROFILES.items():
        em = EmulatedModel(m.int8, profile, use_cache=False, workdir=tmp_path)
        try:
            isa = from_object(em.object_code, em.target.triple)
            assert (isa.int_dot > 0) == (profile in DOTPROD), f"{profile}: {isa.summary()}"
            mmla = profile in I8MM and name != "mlp"  # the MLP's one row per inference: sdot
            assert (isa.dots.get("smmla NEON", 0) > 0) == mmla, f"{profile}: {isa.summary()}"
            assert (isa.dots.get("sdot SVE", 0) > 0) == (profile in SVE_SDOT), f"{profile}: {isa.summary()}"
            for bits in lengths:
                for got, expected in zip(em.run(examples, bits), want, strict=True):
                    assert np.array_equal(got[m.int8.outputs[0]], expected), f"{name} on {profile} at {bits} bits"
        finally:
            em.close()
