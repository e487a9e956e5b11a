"""Scaled-down classic image networks in their original ONNX-zoo (opset 9) form, against ONNX Runtime.

Same layer sequence and op forms as the zoo's AlexNet/CaffeNet, SqueezeNet 1.0, GoogLeNet and
DenseNet exports (LRN, Dropout, Gemm with transB, asymmetric pool pads, 4-branch Concat, Reshape
by an initializer, ...), with few channels, small images and He-scaled random weights.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.compiler import N
from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends.onnx import BatchDependentError, import_onnx

from .test_onnx_frontend import check, make_model


class Net:
    """Appends opset-9 nodes with fresh names and He-scaled random initializers."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits, self.count = rng, [], {}, 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        return out

    def init(self, value: np.ndarray, prefix: str = "w") -> str:
        name = self.fresh(prefix)
        self.inits[name] = value
        return name

    def weight(self, *shape: int, fan_in: int) -> str:
        return self.init((self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))

    def conv(self, x, cin, cout, k, stride=1, pad=0, group=1, relu=True, **attrs) -> str:
        w = self.weight(cout, cin // group, k, k, fan_in=cin // group * k * k)
        b = self.init((0.1 * self.rng.standard_normal(cout)).astype(np.float32), "b")
        y = self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4, group=group, **attrs)
        return self.op("Relu", [y]) if relu else y

    def fc(self, x, cin, cout, gain: float = 1.0) -> str:  # the zoo's Gemm form: W [out, in], transB=1
        w, b = self.weight(cout, cin, fan_in=cin * gain**-2), self.init(np.zeros(cout, np.float32), "b")
        return self.op("Gemm", [x, w, b], alpha=1.0, beta=1.0, transB=1)

    def bn(self, x, c) -> str:
        r = self.rng
        params = [1 + 0.1 * r.standard_normal(c), 0.1 * r.standard_normal(c), 0.1 * r.standard_normal(c),
                  0.5 + r.random(c)]
        inputs = [x, *(self.init(p.astype(np.float32), "bn") for p in params)]
        return self.op("BatchNormalization", inputs, epsilon=1e-5)

    def lrn(self, x) -> str:
        return self.op("LRN", [x], size=5, alpha=1e-4, beta=0.75, bias=1.0)

    def model(self, x_shape, outs: list[str], name: str, opset: int = 9):
        return make_model(self.nodes, {"data": (TensorProto.FLOAT, x_shape)}, outs, self.inits, opset, name)

    def classifier(self, x, cin: int, classes: int) -> list[str]:
        """Logits (small, so the softmax does not saturate) and the softmax: both are outputs."""
        logits = self.fc(x, cin, classes, gain=0.1)
        return [logits, self.op("Softmax", [logits])]


def alexnet(rng, caffenet: bool) -> tuple:
    """conv-relu-LRN-pool x2 (the CaffeNet order pools before LRN), three convs, three FCs, softmax."""
    n = Net(rng)
    x = n.conv("data", 3, 8, 11, stride=4)
    for cin, cout, k, pad, group in [(8, 16, 5, 2, 2)]:
        x = n.op("MaxPool", [n.lrn(x)], kernel_shape=[3, 3], strides=[2, 2]) if not caffenet else \
            n.lrn(n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2]))
        x = n.conv(x, cin, cout, k, pad=pad, group=group)
    x = n.op("MaxPool", [n.lrn(x)], kernel_shape=[3, 3], strides=[2, 2])
    x = n.conv(x, 16, 12, 3, pad=1)
    x = n.conv(x, 12, 12, 3, pad=1, group=2)
    x = n.conv(x, 12, 8, 3, pad=1, group=2)
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    x = n.op("Reshape", [x, n.init(np.array([2, -1], np.int64), "shape")])
    for cin, cout in [(32, 24), (24, 24)]:
        x = n.op("Dropout", [n.op("Relu", [n.fc(x, cin, cout)])], ratio=0.5)
    return n.model([2, 3, 99, 99], n.classifier(x, 24, 10), "caffenet" if caffenet else "alexnet"), (2, 3, 99, 99)


def squeezenet(rng, global_pool: bool) -> tuple:
    """conv1, fire modules (squeeze 1x1, expand 1x1 || 3x3, Concat), conv10, average pool, softmax."""
    n = Net(rng)

    def fire(x, cin, s, e):
        sq = n.conv(x, cin, s, 1)
        return n.op("Concat", [n.conv(sq, s, e, 1), n.conv(sq, s, e, 3, pad=1)], axis=1)

    x = n.op("MaxPool", [n.conv("data", 3, 16, 7, stride=2)], kernel_shape=[3, 3], strides=[2, 2])
    x = fire(fire(x, 16, 4, 8), 16, 4, 8)
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    x = n.op("Dropout", [fire(x, 16, 6, 12)], ratio=0.5)
    x = n.conv(x, 24, 10, 1)
    x = n.op("GlobalAveragePool", [x]) if global_pool else n.op("AveragePool", [x], kernel_shape=[4, 4])
    logits = n.op("Flatten", [x], axis=1)
    return n.model(["N", 3, 48, 48], [logits, n.op("Softmax", [logits])], "squeezenet1.0"), (2, 3, 48, 48)


def googlenet(rng) -> tuple:
    """The Caffe-converted form: pools with asymmetric pads, LRN, 4-branch inception Concats."""
    n = Net(rng)

    def pool(x, k=3, s=2, pads=(0, 0, 1, 1)):
        return n.op("MaxPool", [x], kernel_shape=[k, k], strides=[s, s], pads=list(pads))

    def inception(x, cin, b1, b3r, b3, b5r, b5, bp):
        branches = [n.conv(x, cin, b1, 1), n.conv(n.conv(x, cin, b3r, 1), b3r, b3, 3, pad=1),
                    n.conv(n.conv(x, cin, b5r, 1), b5r, b5, 5, pad=2), n.conv(pool(x, 3, 1, (1, 1, 1, 1)), cin, bp, 1)]
        return n.op("Concat", branches, axis=1)

    x = n.lrn(pool(n.conv("data", 3, 8, 7, stride=2, pad=3)))
    x = n.lrn(n.conv(n.conv(x, 8, 8, 1), 8, 16, 3, pad=1))
    x = inception(pool(x), 16, 4, 4, 8, 2, 4, 4)
    x = pool(inception(x, 20, 6, 4, 8, 2, 4, 6))
    x = n.op("AveragePool", [x], kernel_shape=[2, 2], strides=[1, 1])
    x = n.op("Reshape", [n.op("Dropout", [x], ratio=0.4), n.init(np.array([1, -1], np.int64), "shape")])
    return n.model([1, 3, 32, 32], n.classifier(x, 24, 10), "googlenet"), (1, 3, 32, 32)


def densenet(rng) -> tuple:
    """Stem, a dense block (BN-Relu-Conv1x1-BN-Relu-Conv3x3, Concat onto the input), a transition."""
    n = Net(rng)
    x = n.op("MaxPool", [n.op("Relu", [n.bn(n.conv("data", 3, 8, 3, pad=1, relu=False), 8)])],
             kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c, growth = 8, 4
    for _ in range(3):
        h = n.conv(n.op("Relu", [n.bn(x, c)]), c, 8, 1, relu=False)
        h = n.conv(n.op("Relu", [n.bn(h, 8)]), 8, growth, 3, pad=1, relu=False)
        x, c = n.op("Concat", [x, h], axis=1), c + growth
    x = n.conv(n.op("Relu", [n.bn(x, c)]), c, 10, 1, relu=False)
    x = n.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = n.op("GlobalAveragePool", [n.op("Relu", [n.bn(x, 10)])])
    y = n.fc(n.op("Flatten", [x]), 10, 5)
    return n.model(["batch", 3, 16, 16], [y], "densenet"), (3, 3, 16, 16)


def sum_and_shapes(rng) -> tuple:
    """Sum of three operands, one built by ConstantOfShape(Shape(x)), biases by Unsqueeze, Transposes."""
    n = Net(rng)
    ones = n.op("ConstantOfShape", [n.op("Shape", ["data"])],
                value=numpy_helper.from_array(np.array([0.5], np.float32)))
    bias = n.op("Unsqueeze", [n.init(rng.standard_normal(4).astype(np.float32), "bias")], axes=[0, 2])
    x = n.op("Sum", ["data", ones, bias])
    x = n.op("Transpose", [x], perm=[0, 2, 1])
    x = n.op("MatMul", [x, n.weight(4, 3, fan_in=4)])
    y = n.op("Transpose", [n.op("Relu", [x])])  # default perm: reversed
    return n.model(["N", 4, 6], [y], "sum_shapes"), (2, 4, 6)


NETS = {
    "alexnet": lambda rng: alexnet(rng, caffenet=False),
    "caffenet": lambda rng: alexnet(rng, caffenet=True),
    "squeezenet_global_pool": lambda rng: squeezenet(rng, global_pool=True),
    "squeezenet_average_pool": lambda rng: squeezenet(rng, global_pool=False),
    "googlenet": googlenet,
    "densenet": densenet,
}


# Caffe-trained nets see mean-subtracted 0..255 pixels; at that scale their LRN (alpha 1e-4) matters.
PIXEL_SCALE = {"alexnet": 50.0, "caffenet": 50.0, "googlenet": 50.0}


@pytest.mark.parametrize("net", sorted(NETS))
def test_classic_net_matches_onnxruntime(rng, net):
    model, shape = NETS[net](rng)
    data = rng.standard_normal(shape, dtype=np.float32) * np.float32(PIXEL_SCALE.get(net, 1.0))
    graph = check(model, {"data": data})
    assert graph.name == model.graph.name
    assert "Softmax" in {n.op for n in graph.nodes} or net == "densenet"


def test_symbolic_batch_nets_run_at_several_batch_sizes(rng):
    model, (_, *rest) = squeezenet(rng, global_pool=True)
    assert import_onnx(model).types["data"].shape[0] == N
    for batch in (1, 3):
        check(model, {"data": rng.standard_normal((batch, *rest), dtype=np.float32)})


def test_sum_constant_of_shape_unsqueeze_transpose(rng):
    model, shape = sum_and_shapes(rng)
    # ones shaped like a batch-sized input cannot be a constant without a fixed batch
    with pytest.raises(BatchDependentError, match="batch_size"):
        import_onnx(model)
    check(model, {"data": rng.standard_normal(shape, dtype=np.float32)}, batch_size=shape[0])


def test_net_with_unsupported_layers_fails_with_one_error(rng):
    """An opset-9 segmentation-style net: Upsample imports (as Resize), MaxRoiPool is not in the op set,
    and the one error names both of its nodes."""
    n = Net(rng)
    x = n.conv("data", 3, 4, 3, pad=1)
    up1 = n.op("Upsample", [x, n.init(np.array([1, 1, 2, 2], np.float32), "scales")], mode="nearest")
    rois = n.init(np.array([[0, 0, 0, 3, 3]], np.float32), "rois")
    norm = n.op("MaxRoiPool", [up1, rois], pooled_shape=[4, 4])
    up2 = n.op("Upsample", [n.conv(norm, 4, 4, 3, pad=1), n.init(np.array([1, 1, 2, 2], np.float32), "scales")])
    norm2 = n.op("MaxRoiPool", [up2, rois], pooled_shape=[4, 4])
    model = n.model([1, 3, 8, 8], [n.op("Softmax", [norm2])], "segnet")
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(model)
    assert set(err.value.unsupported) == {"MaxRoiPool"}
    assert err.value.unsupported["MaxRoiPool"] == (f"{norm}_node", f"{norm2}_node")
    assert f"{norm}_node" in str(err.value)
