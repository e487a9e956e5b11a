"""The IR-as-torch module computes what the reference interpreter computes, and refuses what it cannot train."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types, run_reference, verify
from cuvil.edge_runtime.training import TrainingUnsupported

from .helpers import cnn_graph, digits_like


def test_forward_gives_the_logits_whose_softmax_the_interpreter_computes():
    import torch

    from cuvil.edge_runtime.training.torch_graph import TorchGraph

    graph = cnn_graph(seed=1, batch=1)  # a static batch of 1, as imported models have; training batches freely
    x, _ = digits_like(5, seed=2)
    module = TorchGraph(graph)
    with torch.no_grad():
        probs = torch.softmax(module(torch.from_numpy(x)), -1).numpy()
    for i in range(len(x)):
        want = run_reference(graph, {"x": x[i:i + 1]})["probs"]
        np.testing.assert_allclose(probs[i:i + 1], want, rtol=1e-5, atol=1e-6)


def test_weights_round_trip_in_the_graph_layout_including_a_transposed_gemm():
    from cuvil.edge_runtime.training.torch_graph import TorchGraph

    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal((6, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    graph = verify(infer_graph_types("g", {"x": TensorType(DType.F32, (N, 6))}, consts,
                                     [Node.make("Gemm", ["x", "w", "b"], ["y"], transB=0)], ["y"]))
    module = TorchGraph(graph)
    got = module.weights()
    assert set(got) == {"w", "b"} and got["w"].shape == (6, 3)
    np.testing.assert_array_equal(got["w"], consts["w"])
    moved = {"w": consts["w"] + 1, "b": consts["b"] - 1}
    module.load_weights(moved)
    np.testing.assert_array_equal(module.weights()["w"], moved["w"])


def test_unsupported_ops_are_named_all_at_once():
    from cuvil.edge_runtime.training.torch_graph import TorchGraph

    consts = {"s": np.ones(4, np.float32), "m": np.zeros(4, np.float32), "v": np.ones(4, np.float32),
              "g": np.ones(4, np.float32), "bb": np.zeros(4, np.float32)}
    nodes = [Node.make("BatchNormalization", ["x", "g", "bb", "m", "v"], ["y"]),
             Node.make("Exp", ["y"], ["z"])]
    graph = verify(infer_graph_types("bn", {"x": TensorType(DType.F32, (N, 4, 2, 2))}, consts, nodes, ["z"]))
    with pytest.raises(TrainingUnsupported, match="BatchNormalization, Exp") as info:
        TorchGraph(graph)
    assert "supported:" in str(info.value)


def _mlp(extra: list, consts: dict, batch: object = N):
    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal((4, 3)).astype(np.float32), **consts}
    nodes = [Node.make("Gemm", ["x", "w"], ["h"]), *extra]
    graph = infer_graph_types("mlp", {"x": TensorType(DType.F32, (batch, 4))}, consts, nodes, [nodes[-1].outputs[0]])
    return verify(graph)


@pytest.mark.parametrize("extra, consts, batch, what", [
    ([Node.make("Softmax", ["h"], ["m"], axis=0), Node.make("Relu", ["m"], ["y"])], {}, N, "across the batch axis"),
    ([Node.make("LogSoftmax", ["h"], ["m"], axis=-2), Node.make("Relu", ["m"], ["y"])], {}, N, "across the batch axis"),
    ([Node.make("Mul", ["h", "k"], ["y"])], {"k": np.ones((5, 3), np.float32)}, 1, "batch axis of its own"),
])
def test_a_model_that_mixes_examples_is_refused(extra, consts, batch, what):
    """Opacus clips each row's gradient: that bounds one example only while rows stay apart. A softmax over
    the batch (a coordinator's model could use one to single out a record), or a tensor with rows of its own
    that every example meets, is refused; a per-example softmax and a broadcast constant train."""
    from cuvil.edge_runtime.training.torch_graph import TorchGraph

    with pytest.raises(TrainingUnsupported, match=what):
        TorchGraph(_mlp(extra, consts, batch))
    TorchGraph(_mlp([Node.make("Softmax", ["h"], ["m"], axis=1), Node.make("Mul", ["m", "k"], ["y"])],
                    {"k": np.ones((1, 3), np.float32)}))
