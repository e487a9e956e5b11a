"""A small digits CNN built twice: as Cuvil IR (what a device holds) and by hand in torch (the reference)."""

from __future__ import annotations

import numpy as np

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types, verify


def cnn_graph(seed: int = 0, width: int = 4, batch: object = N):
    """Conv-Relu-MaxPool-Conv-Relu-MaxPool-Reshape-Gemm-Softmax over [batch, 1, 8, 8] (the demo's shape)."""
    rng = np.random.default_rng(seed)
    c = {
        "conv1.weight": rng.normal(0, 0.5, (width, 1, 3, 3)), "conv1.bias": rng.normal(0, 0.1, width),
        "conv2.weight": rng.normal(0, 0.3, (2 * width, width, 3, 3)), "conv2.bias": rng.normal(0, 0.1, 2 * width),
        "fc.weight": rng.normal(0, 0.3, (10, 8 * width)), "fc.bias": rng.normal(0, 0.1, 10),
    }
    c = {k: v.astype(np.float32) for k, v in c.items()}
    conv = dict(strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1)
    pool = dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1])
    nodes = [
        Node.make("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], **conv),
        Node.make("Relu", ["c1"], ["r1"]),
        Node.make("MaxPool", ["r1"], ["p1"], **pool),
        Node.make("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], **conv),
        Node.make("Relu", ["c2"], ["r2"]),
        Node.make("MaxPool", ["r2"], ["p2"], **pool),
        Node.make("Reshape", ["p2"], ["flat"], shape=[0, 8 * width]),
        Node.make("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1),
        Node.make("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = infer_graph_types("digits-cnn", {"x": TensorType(DType.F32, (batch, 1, 8, 8))}, c, nodes, ["probs"])
    return verify(graph)


def reference_model(graph):
    """The same network written by hand in torch, returning logits, with the graph's weights."""
    import torch
    from torch import nn

    c = graph.constants
    width = c["conv1.weight"].shape[0]

    class Cnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, width, 3, padding=1)
            self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
            self.fc = nn.Linear(8 * width, 10)

        def forward(self, t):
            t = torch.max_pool2d(torch.relu(self.conv1(t)), 2)
            t = torch.max_pool2d(torch.relu(self.conv2(t)), 2)
            return self.fc(torch.flatten(t, 1))

    model = Cnn()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.array(c[name])))
    return model


def digits_like(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)
