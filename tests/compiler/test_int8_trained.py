"""int8 where fp32 is right: the MLP and the small CNN of the zoo trained on scikit-learn's digits
(``tests/digits_zoo.py``), quantized by Cuvil's default form from 32 training digits, compiled for
this host and evaluated on 1,000 held-out digits. The random zoo (``test_int8_zoo.py``) cannot show
this: its outputs barely depend on the input for the larger models. ResNet-18 and MobileNetV2 train
for minutes, so ``benchmarks/int8_accuracy.py --trained`` measures them.

Goals (issue: INT8 end to end): top-1 agreement with fp32 >= 99%; here also the accuracy on the
digits' labels no more than half a point below fp32's (measured: 0.0 for both).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.digits_zoo import TEST, digit_data, trained  # noqa: E402
from tests.int8_zoo import CALIBRATION, quantized  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
BATCH = 100


def predictions(graph, xs):
    sess = compile_graph(graph, batch=BATCH, use_cache=False)
    name, out = graph.inputs[0], graph.outputs[0]
    return [int(c) for i in range(0, len(xs), BATCH) for c in sess.run({name: xs[i:i + BATCH]})[out].argmax(-1)]


@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_trained_int8_agrees_with_fp32_and_keeps_its_accuracy(name):
    module, example = trained(name)
    train_x, _, xs, labels = digit_data(tuple(example[0].shape[1:]))
    assert len(xs) == TEST
    m = quantized(name, module, example, train_x[:CALIBRATION])
    fp32, int8 = predictions(m.fp32, xs), predictions(m.int8, xs)
    accuracy = lambda ps: sum(p == y for p, y in zip(ps, labels)) / TEST  # noqa: E731
    assert accuracy(fp32) >= 0.95, f"{name} did not learn the digits: {accuracy(fp32):.1%}"
    assert sum(a == b for a, b in zip(fp32, int8)) / TEST >= 0.99
    assert accuracy(int8) >= accuracy(fp32) - 0.005
