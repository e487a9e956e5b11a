"""The architecture set under qemu: cross-compiled for a Raspberry Pi 5 (NEON), run by the emulation
harness with the arena and weights between guard pages, checked against ONNX Runtime.

A fault outside the buffers dies with SIGSEGV (an EmulationError naming it). The ResNet, VGG and
ResNeXt variants are left to the native run (``tests/compiler/test_architectures.py``): their ops
(conv, batch norm, pooling, Gemm) are the zoo's, which ``test_emulation.py`` runs under qemu, and
they cost minutes of emulation; every architecture with another op mix runs here.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import cuvil  # noqa: E402
from cuvil.edge_runtime.emulated import EmulatedModel  # noqa: E402
from tests.archs import ARCHS  # noqa: E402
from tests.compiler.test_architectures import ATOL, RTOL, Case  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                       reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]
ZOO_LIKE = {"vgg_small", "resnet18_imagenet", "resnet50", "resnext_tiny"}


@pytest.mark.parametrize("name", [n for n in ARCHS if n not in ZOO_LIKE])
def test_architecture_under_qemu_with_guard_pages(name, tmp_path):
    case = Case(name)
    graph = cuvil.import_model(case.onnx)
    em = EmulatedModel(graph, "rpi5", use_cache=False, workdir=tmp_path)
    (got,) = em.run([dict(zip(graph.inputs, case.inputs))])
    out = got[graph.outputs[0]]
    assert out.shape == case.expected.shape
    np.testing.assert_allclose(out, case.expected, rtol=RTOL, atol=ATOL)
    em.close()
