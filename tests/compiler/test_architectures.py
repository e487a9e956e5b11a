"""Architectures beyond the zoo (``tests/archs.py``), compiled natively and checked against ONNX Runtime.

Correctness only (timing is ``benchmarks/arch_sweep.py``'s): every architecture Cuvil supports is
exported to ONNX, imported through the public API, compiled for this machine (a cold compile: the
session's cache starts empty) and run on fresh seeded inputs; its output must match ONNX Runtime's
on the same export within rtol 1e-4 / atol 1e-5, with its arena and weights between guard pages.
Recurrent models also go through the torch frontend, which unrolls them itself. Every architecture
the torch frontend cannot import must fail with UnsupportedModelError naming the op.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import cuvil  # noqa: E402
from cuvil.compiler.errors import UnsupportedModelError  # noqa: E402
from tests.archs import ARCHS, UNSUPPORTED  # noqa: E402
from tests.guarded import run_in_child  # noqa: E402
from tests.zoo import export_onnx  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # torch.export's own
RTOL, ATOL = 1e-4, 1e-5
RECURRENT = ["lstm_kws", "gru_kws"]
# Test-sized variants, where a size knob cuts the test's time (torch.export unrolls every LSTM frame:
# 49 frames take 12 s to capture; squeezenet, tiny_yolo, mobilenet_v1 compile about twice as fast at 64x64).
SMALLER = {"lstm_kws": {"frames": 8}, "gru_kws": {"frames": 8}, "squeezenet": {"size": 64}, "tiny_yolo": {"size": 64},
           "mobilenet_v1": {"size": 64}}


class Case:
    """One architecture: module, ONNX export, fresh inputs and ORT's outputs on them."""

    def __init__(self, name: str):
        self.model, example = ARCHS[name](**SMALLER.get(name, {}))
        self.onnx = export_onnx(self.model, example, None)
        rng = np.random.default_rng(1234)  # not the export's example: a baked-in activation would show
        self.inputs = [rng.standard_normal(tuple(x.shape)).astype(np.float32) if x.is_floating_point() else
                       rng.integers(0, int(x.max()) + 1, tuple(x.shape)).astype(x.numpy().dtype) for x in example]
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # a reference: no layout rewrites
        sess = ort.InferenceSession(self.onnx.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.expected = sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), self.inputs)})[0]

    def torch_inputs(self) -> tuple:
        return tuple(torch.from_numpy(x) for x in self.inputs)

    def compiled(self, graph) -> np.ndarray:
        """Outputs of the native code, run with its arena and weights between guard pages (in a child
        process, so a memory fault fails this architecture's test alone)."""
        (out,) = graph.outputs
        return run_in_child(cuvil.compile(graph, guard_pages=True), dict(zip(graph.inputs, self.inputs)))[out]


def assert_matches_ort(case: Case, got: np.ndarray) -> None:
    assert got.shape == case.expected.shape and got.dtype == case.expected.dtype
    np.testing.assert_allclose(got, case.expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ARCHS)
def test_compiled_onnx_import_matches_ort(name):
    case = Case(name)
    assert_matches_ort(case, case.compiled(cuvil.import_model(case.onnx)))


@pytest.mark.parametrize("name", RECURRENT)
def test_recurrent_compiles_through_torch_frontend_and_matches_ort(name):
    case = Case(name)
    assert_matches_ort(case, case.compiled(cuvil.import_model(case.model, case.torch_inputs())))


@pytest.mark.parametrize("name", ["unet", "unet_nearest", "groupnorm_cnn"])
def test_transposed_convs_upsampling_and_group_norm_import_through_torch_and_match_ort(name):
    """Refused by the torch frontend until it took transposed convolution, upsampling and group norm."""
    case = Case(name)
    assert_matches_ort(case, case.compiled(cuvil.import_model(case.model, case.torch_inputs())))


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_torch_op_is_named(name):
    model, example = ARCHS[name]()
    with pytest.raises(UnsupportedModelError, match=rf"unsupported op\(s\): .*{re.escape(UNSUPPORTED[name])}"):
        cuvil.import_model(model, example)
