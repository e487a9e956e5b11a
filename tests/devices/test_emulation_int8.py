"""The zoo in int8 under qemu: compiled int8 output equals the int8 reference interpreter exactly
(integer arithmetic is exact) on SVE2 at 128 and 512 bits and on NEON-only CPU models with dotprod
(``sdot`` present in the object code of both) and without it (Jetson Xavier: widened multiply-adds),
and with i8mm (Graviton4 at 128 and 512 bits: ``smmla`` in the object code); the SVE2 build's GEMMs
are SVE ``sdot`` (one vector-length agnostic build run at both lengths). The same for QDQ models made
by ONNX Runtime's static quantization from networks beyond the zoo."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from cuvil.compiler import run_reference
from cuvil.devices.isa_report import from_object
from cuvil.edge_runtime.emulated import EmulatedModel

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from cuvil.compiler.frontends.onnx import import_onnx  # noqa: E402
from cuvil.compiler.passes.pipeline import optimize  # noqa: E402
from tests.compiler.frontends.test_onnx_quant import _Net  # noqa: E402
from tests.int8_zoo import CNN_AND_MLP, int8_model  # noqa: E402
from tests.qdq import draws, qdq_model  # noqa: E402

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


def _exact_on_every_profile(graph, examples, name: str, tmp_path, one_row: bool = False) -> None:
    """``graph`` under qemu on every profile and length equals the reference on ``examples``; each
    build holds its ISA's integer dot products (``one_row``: a matmul of one row, no smmla pairs)."""
    out = graph.outputs[0]
    want = [run_reference(graph, ex)[out] for ex in examples]
    for profile, lengths in PROFILES.items():
        em = EmulatedModel(graph, profile, use_cache=False, workdir=tmp_path)
        try:
            isa = from_object(em.object_code, em.target.triple)
            assert (isa.int_dot > 0) == (profile in DOTPROD), f"{profile}: {isa.summary()}"
            mmla = profile in I8MM and not one_row
            assert (isa.dots.get("smmla NEON", 0) > 0) == mmla, f"{profile}: {isa.summary()}"
            assert (isa.dots.get("sdot SVE", 0) > 0) == (profile in SVE_SDOT), f"{profile}: {isa.summary()}"
            for bits in lengths:
                for got, expected in zip(em.run(examples, bits), want, strict=True):
                    assert np.array_equal(got[out], expected), f"{name} on {profile} at {bits} bits"
        finally:
            em.close()


@pytest.mark.parametrize("name", MODELS)
def test_zoo_int8_is_exact_under_qemu(name, tmp_path):
    m = int8_model(name)
    count = 1 if name in SLOW else 3
    xs = m.inputs(count, seed=11)
    examples = [{m.int8.inputs[0]: xs[i:i + 1]} for i in range(count)]
    _exact_on_every_profile(m.int8, examples, name, tmp_path, one_row=name == "mlp")


QDQ_NETS = {  # beyond the zoo, quantized by onnxruntime.quantization (QDQ, per-channel int8 weights)
    "grouped_residual": (_Net, (1, 3, 10, 10)),  # grouped conv, residual QAdd, max-pool, biased linear head
    # a padded stride-1 max-pool, then depthwise by window-row quads: a 9x7 plane by rows (NEON: a partial
    # last vector), 5x4 as runs across rows
    "pad_pool_depthwise": (lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.ZeroPad2d((0, 1, 0, 1)), nn.MaxPool2d(2, 1),
        nn.Conv2d(8, 8, 3, 2, 1, groups=8), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1, groups=8), nn.Conv2d(8, 5, 1)), (1, 3, 17, 13)),
    # a U-Net's 2x2 up-convolution has no integer form: its int8 weights are dequantized when compiling
    # and it runs as a float 1x1 Conv between a DequantizeLinear and a QuantizeLinear
    "up_conv": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(8, 4, 2, stride=2),
                                      nn.ReLU(), nn.Conv2d(4, 3, 1)), (1, 3, 8, 8)),
}


@pytest.mark.parametrize("name", QDQ_NETS)
def test_qdq_models_are_exact_under_qemu(name, tmp_path):
    build, shape = QDQ_NETS[name]
    torch.manual_seed(0)
    _, qdq = qdq_model(build().eval(), (torch.randn(*shape),))
    graph = optimize(import_onnx(qdq))
    examples = [{graph.inputs[0]: x} for x in draws(shape, 2, seed=5)]
    _exact_on_every_profile(graph, examples, name, tmp_path)
