"""Every zoo model through both frontends, checked against ONNX Runtime and torch eager.

(a) ONNX export → import_onnx → run_reference vs ONNX Runtime on the same export;
(b) import_torch → run_reference vs ONNX Runtime on that export and vs torch eager;
(c) the text form round-trips both graphs. Inputs are random, seeded, and not the export's own
example inputs, so a frontend that baked an activation into a constant would fail.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from cuvil.compiler import parse_graph, print_graph, run_reference, verify  # noqa: E402
from tests.zoo import ZOO, export_onnx  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # torch.export's own
RTOL, ATOL = 1e-4, 1e-5
SLOW = {"resnet18", "mobilenet_v2"}
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ZOO]


class Case:
    """One zoo model with its export, seeded inputs and expected outputs, imported lazily."""

    def __init__(self, name: str):
        self.name = name
        self.model, example = ZOO[name]()
        self.onnx = export_onnx(self.model, example, None)
        rng = np.random.default_rng(1234)
        self.inputs = [rng.standard_normal(tuple(x.shape)).astype(np.float32) for x in example]
        self.expected_ort = ort_run(self.onnx, self.inputs)
        with torch.no_grad():
            self.expected_torch = self.model(*(torch.from_numpy(x) for x in self.inputs)).numpy()
        self._graphs: dict[str, object] = {}

    def graph(self, frontend: str):
        if frontend not in self._graphs:
            if frontend == "onnx":
                from cuvil.compiler.frontends.onnx import import_onnx

                self._graphs[frontend] = import_onnx(self.onnx)
            else:
                from cuvil.compiler.frontends.torch import import_torch

                self._graphs[frontend] = import_torch(self.model, tuple(torch.from_numpy(x) for x in self.inputs))
        return self._graphs[frontend]

    def run(self, frontend: str) -> np.ndarray:
        graph = self.graph(frontend)
        (out,) = graph.outputs
        return run_reference(graph, dict(zip(graph.inputs, self.inputs)))[out]


def ort_run(model, inputs: list[np.ndarray]) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, inputs)))[0]


_CASES: dict[str, Case] = {}


@pytest.fixture(params=MODELS)
def case(request) -> Case:
    if request.param not in _CASES:
        _CASES.clear()  # keep one model's weights and graphs alive at a time
        _CASES[request.param] = Case(request.param)
    return _CASES[request.param]


def test_torch_eager_agrees_with_ort(case):
    """Guards the test itself: the export must compute what the module computes."""
    np.testing.assert_allclose(case.expected_ort, case.expected_torch, rtol=RTOL, atol=ATOL)


def test_onnx_import_matches_ort(case):
    got = case.run("onnx")
    assert got.shape == case.expected_ort.shape and got.dtype == case.expected_ort.dtype
    np.testing.assert_allclose(got, case.expected_ort, rtol=RTOL, atol=ATOL)


def test_torch_import_matches_ort_and_eager(case):
    got = case.run("torch")
    assert got.shape == case.expected_ort.shape and got.dtype == case.expected_ort.dtype
    np.testing.assert_allclose(got, case.expected_ort, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got, case.expected_torch, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("frontend", ["onnx", "torch"])
def test_text_form_round_trips(case, frontend):
    graph = case.graph(frontend)
    again = parse_graph(print_graph(graph))
    assert again == graph
    verify(again)
    assert print_graph(again) == print_graph(graph)


def test_dynamic_batch_export_runs_at_another_batch(case):
    """The symbolic-batch path of the ONNX frontend, at batch 3, against ONNX Runtime.

    The transformer's attention reshapes to [L, heads*N, d], which the frontend does not express
    symbolically yet, so it is imported for the fixed batch (the path its error message names).
    """
    from cuvil.compiler.frontends.onnx import import_onnx

    model, example = ZOO[case.name]()
    proto = export_onnx(model, example, None, dynamic_batch=True)
    rng = np.random.default_rng(99)
    inputs = [rng.standard_normal((3, *x.shape[1:])).astype(np.float32) for x in example]
    graph = import_onnx(proto, batch_size=3 if case.name == "tiny_transformer" else None)
    (out,) = graph.outputs
    got = run_reference(graph, dict(zip(graph.inputs, inputs)))[out]
    np.testing.assert_allclose(got, ort_run(proto, inputs), rtol=RTOL, atol=ATOL)
