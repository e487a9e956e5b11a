"""ONNX's quantized forms in: QDQ models of onnxruntime.quantization, QLinearConv, QLinearMatMul, MatMulInteger."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from cuvil.compiler import run_reference
from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.compiler.passes.pipeline import optimize
from cuvil.edge_runtime.compile import compile_graph
from tests.qdq import draws, ort_session, qdq_model


class _Net(nn.Module):
    """Beyond the zoo: grouped conv, a residual add, max-pool, a biased linear head."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.ReLU6())
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 5 * 5, 6)

    def forward(self, x):
        y = self.a(x)
        return self.fc(torch.flatten(self.pool(y + self.b(y)), 1))


def _quanta(got, want, scale):
    return float(np.abs(got - want).max() / scale)


@pytest.mark.parametrize("activations", ["QUInt8", "QInt8"])
def test_qdq_model_imports_into_integer_ops_within_one_quantum_of_onnx_runtime(activations):
    torch.manual_seed(0)
    net = _Net().eval()
    _, qdq = qdq_model(net, (torch.randn(1, 3, 10, 10),), activations=activations)
    graph = optimize(import_onnx(qdq, batch_size=None))
    ops = Counter(n.op for n in graph.nodes)
    assert ops["QConv"] == 3 and ops["QAdd"] == 1 and ops["QMatMul"] == 1 and "Conv" not in ops  # the grouped one a group
    assert ops["Split"] == ops["Concat"] == 1
    out_scale = next(n for n in graph.nodes if n.outputs[0] == "output").attr["scale"][0]
    sess = ort_session(qdq)
    for x in draws((3, 3, 10, 10), 2, seed=7):
        want = sess.run(None, {"input": x})[0]
        got = run_reference(graph, {"input": x})["output"]
        assert _quanta(got, want, out_scale) <= 1.0001


def _single(node, inits, inputs, outputs, opset=13):
    g = helper.make_graph([node], "q", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_qlinear_conv_and_qlinear_matmul_import_as_integer_ops():
    rng = np.random.default_rng(0)
    inits = {"xs": np.float32(0.02), "xz": np.uint8(128), "w": rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
             "ws": np.full(4, 0.01, np.float32), "wz": np.zeros(4, np.int8), "ys": np.float32(0.1),
             "yz": np.uint8(5), "b": rng.integers(-99, 99, (4,)).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1] * 4)
    x_info = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 5, 5])
    model = _single(node, inits, [x_info], [helper.make_tensor_value_info("y", TensorProto.UINT8, None)])
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes] == ["QConv"]
    x = rng.integers(0, 256, (1, 3, 5, 5)).astype(np.uint8)
    want = ort_session(model).run(None, {"x": x})[0]
    assert np.abs(run_reference(graph, {"x": x})["y"].astype(int) - want).max() <= 1

    inits["wz"] = np.full(4, 3, np.int8)  # asymmetric weights: the float chain
    model = _single(node, inits, [x_info], [helper.make_tensor_value_info("y", TensorProto.UINT8, None)])
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes][-2:] == ["Conv", "QuantizeLinear"]
    want = ort_session(model).run(None, {"x": x})[0]
    assert np.abs(run_reference(graph, {"x": x})["y"].astype(int) - want).max() <= 1

    mm = {"as": np.float32(0.02), "az": np.uint8(100), "b": rng.integers(-127, 128, (6, 4)).astype(np.int8),
          "bs": np.float32(0.01), "bz": np.int8(0), "ys": np.float32(0.05), "yz": np.uint8(128)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    a_info = helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 6])
    model = _single(node, mm, [a_info], [helper.make_tensor_value_info("y", TensorProto.UINT8, None)])
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes] == ["QMatMul"]
    a = rng.integers(0, 256, (2, 6)).astype(np.uint8)
    want = ort_session(model).run(None, {"a": a})[0]
    assert np.abs(run_reference(graph, {"a": a})["y"].astype(int) - want).max() <= 1


def test_matmul_integer_is_exact():
    rng = np.random.default_rng(1)
    inits = {"b": rng.integers(-128, 128, (5, 3)).astype(np.int8), "az": np.uint8(7), "bz": np.int8(-2)}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    model = _single(node, inits, [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 5])],
                    [helper.make_tensor_value_info("y", TensorProto.INT32, None)], opset=10)
    a = rng.integers(0, 256, (4, 5)).astype(np.uint8)
    want = ort_session(model).run(None, {"a": a})[0]
    got = run_reference(import_onnx(model), {"a": a})["y"]
    assert got.dtype == np.int32 and np.array_equal(got, want)
    assert np.array_equal(got, (a.astype(np.int64) - 7) @ (inits["b"].astype(np.int64) + 2))


def _run_time_scale(scale_shape, opset=13, x_type=TensorProto.FLOAT):
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0)
    return _single(node, {"z": np.uint8(3) if not scale_shape else np.full(scale_shape, 3, np.uint8)},
                   [helper.make_tensor_value_info("x", x_type, [2, 7]),
                    helper.make_tensor_value_info("s", TensorProto.FLOAT, scale_shape)],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], opset=opset)


def test_a_per_tensor_scale_given_at_run_time_quantizes_as_onnx_runtime():
    """ONNX's definition, clip(rint(x / scale) + zero_point), where the scale is a value of the model."""
    model = _run_time_scale([])
    graph = import_onnx(model)
    x = np.linspace(-1.0, 1.0, 14, dtype=np.float32).reshape(2, 7)
    for scale in (0.01, 0.0078125, 1e-3):
        feeds = {"x": x, "s": np.array(scale, np.float32)}
        want = ort_session(model).run(None, feeds)[0]
        for got in (run_reference(graph, feeds)["y"], compile_graph(graph, use_cache=False).run(feeds)["y"]):
            np.testing.assert_array_equal(got, want)


def test_per_axis_scales_must_be_constants_and_can_be_fixed():
    """Per-axis scales given at run time are refused, naming the graph input that fixes it."""
    from cuvil.compiler.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="must be a constant") as e:
        import_onnx(_run_time_scale([2]))
    assert e.value.constant_inputs == ("s",)


def test_half_input_quantizes_as_onnx_runtime():
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    model = _single(node, {"s": np.float16(0.1), "z": np.int8(3)},
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [9])],
                    [helper.make_tensor_value_info("y", TensorProto.INT8, None)], opset=21)
    x = np.array([1.0, -2.0, 3.5, 0.05, 0.15, -0.25, 100.0, -100.0, 7.77], np.float16)
    graph = import_onnx(model)
    want = ort_session(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(compile_graph(graph, use_cache=False).run({"x": x})["y"], want)


DYNAMIC_INPUTS = {"normal": lambda r: r.standard_normal((2, 7)), "positive": lambda r: np.abs(r.standard_normal((2, 7))) + 1,
                  "negative": lambda r: -np.abs(r.standard_normal((2, 7))), "tiny": lambda r: r.standard_normal((2, 7)) * 1e-3,
                  "constant": lambda r: np.full((2, 7), 3.0)}


@pytest.mark.parametrize("draw", DYNAMIC_INPUTS, ids=str)
def test_dynamic_quantize_linear_matches_onnx_runtime(draw):
    """Its ONNX function body: the scale and zero point found at run time from x's range (with 0)."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    model = _single(node, {}, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7])],
                    [helper.make_empty_tensor_value_info(o) for o in "ysz"], opset=11)
    x = DYNAMIC_INPUTS[draw](np.random.default_rng(3)).astype(np.float32)
    graph = import_onnx(model)
    want = ort_session(model).run(None, {"x": x})
    for got in (run_reference(graph, {"x": x}), compile_graph(graph, use_cache=False).run({"x": x})):
        for name, w in zip(graph.outputs, want):
            np.testing.assert_array_equal(got[name], w, err_msg=name)


def test_a_dynamically_quantized_model_matches_onnx_runtime(tmp_path):
    """onnxruntime.quantization.quantize_dynamic: DynamicQuantizeLinear -> MatMulInteger -> scales (its
    zero point was a non-constant input MatMulInteger refused)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tests.zoo import export_onnx

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    export_onnx(net, (torch.randn(3, 16),), tmp_path / "f32.onnx")
    quantize_dynamic(tmp_path / "f32.onnx", tmp_path / "q.onnx", weight_type=QuantType.QUInt8)
    graph = import_onnx(str(tmp_path / "q.onnx"))
    session = compile_graph(graph, use_cache=False)
    import onnx

    model = onnx.load(tmp_path / "q.onnx")
    assert "DynamicQuantizeLinear" in {n.op_type for n in model.graph.node}
    for x in draws((3, 16), 4, seed=5):
        want = ort_session(model).run(None, {graph.inputs[0]: x})[0]
        np.testing.assert_allclose(session.run({graph.inputs[0]: x})[graph.outputs[0]], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("net,shape,float_convs", [
    (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.ZeroPad2d((0, 1, 0, 1)), nn.MaxPool2d(2, 1),
                   nn.Conv2d(8, 4, 1)), (1, 3, 6, 6), 0),  # ORT quantizes Pad's value: a DequantizeLinear'd scalar
    (nn.Sequential(nn.Conv1d(2, 6, 5, padding=2), nn.ReLU(), nn.Conv1d(6, 6, 3, 2, 1, groups=6),  # 1-D: QConvs
                   nn.Conv1d(6, 4, 3, dilation=2)), (1, 2, 40), 0),  # over a height of one
    (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(8, 4, 2, stride=2)),  # no integer
                   (1, 3, 6, 6), 1),  # form: the up-conv runs in float, its weights dequantized once (a 1x1 Conv)

])
def test_qdq_models_beyond_the_zoo_compile_exactly_within_one_quantum(net, shape, float_convs):
    from cuvil.edge_runtime.compile import compile_graph

    torch.manual_seed(0)
    _, qdq = qdq_model(net.eval(), (torch.randn(*shape),))
    graph = optimize(import_onnx(qdq))
    assert Counter(n.op for n in graph.nodes)["Conv"] == float_convs
    out = graph.outputs[0]
    out_scale = graph.producers()[out].attr["scale"][0]
    sess, ort = compile_graph(graph, use_cache=False), ort_session(qdq)
    for x in draws(shape, 2, seed=3):
        got = sess.run({graph.inputs[0]: x})[out]
        assert np.array_equal(got, run_reference(graph, {graph.inputs[0]: x})[out])
        assert _quanta(got, ort.run(None, {qdq.graph.input[0].name: x})[0], out_scale) <= 1.0001


@pytest.mark.parametrize("to", [TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.FLOAT8E4M3FN,
                                TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT4E2M1])
def test_qdq_to_storage_only_types_matches_onnx_reference(to):
    """Per-axis QuantizeLinear to int4/int2/float8/float4 and back, natively and in the reference,
    against ONNX's own reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    from cuvil.edge_runtime.compile import compile_graph

    is_int = to in (TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2)
    zp = helper.make_tensor("zp", to, [3], [1, 0, 1] if is_int else [0, 0, 0])
    scale = numpy_helper.from_array(np.array([0.5, 0.25, 2.0], np.float32), "scale")
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("q", to, [2, 3, 4]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [scale, zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.random.default_rng(0).uniform(-40, 40, (2, 3, 4)).astype(np.float32)
    q_want, y_want = ReferenceEvaluator(model).run(None, {"x": x})
    cuvil = import_onnx(model)
    q_name, y_name = cuvil.outputs
    for got in (run_reference(cuvil, {cuvil.inputs[0]: x}), compile_graph(cuvil, optimize=False).run({cuvil.inputs[0]: x})):
        assert got[q_name].dtype == q_want.dtype
        np.testing.assert_array_equal(got[q_name].astype(np.float32), q_want.astype(np.float32))
        np.testing.assert_array_equal(got[y_name], y_want)


@pytest.mark.parametrize("to", [TensorProto.UINT8, TensorProto.INT4])
def test_blocked_qdq_matches_onnx_reference(to):
    """block_size: one scale and zero point per block of 3 along axis 1 (the last block short)."""
    from onnx.reference import ReferenceEvaluator

    from cuvil.edge_runtime.compile import compile_graph

    scale = numpy_helper.from_array(np.array([[0.5, 0.25, 2.0], [1.0, 0.125, 4.0]], np.float32), "scale")
    zp = helper.make_tensor("zp", to, [2, 3], [1, 0, 3, 2, 0, 1])
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], axis=1, block_size=3),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], axis=1, block_size=3)]
    graph = helper.make_graph(nodes, "blocked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("q", to, [2, 8]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [scale, zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.random.default_rng(1).uniform(-30, 30, (2, 8)).astype(np.float32)
    q_want, y_want = ReferenceEvaluator(model).run(None, {"x": x})
    cuvil = import_onnx(model)
    q_name, y_name = cuvil.outputs
    for got in (run_reference(cuvil, {cuvil.inputs[0]: x}), compile_graph(cuvil, optimize=False).run({cuvil.inputs[0]: x})):
        np.testing.assert_array_equal(got[q_name].astype(np.float32), q_want.astype(np.float32))
        np.testing.assert_array_equal(got[y_name], y_want)


def test_weights_no_integer_op_takes_are_dequantized_once_at_compile_time():
    """An int8 U-Net's up-convolution has no integer form: it must run in float on constant weights
    (rewritten to a 1x1 Conv and packed), never dequantize its weights each run and take the kernel
    of a weight that is an activation (15 ms against ONNX Runtime's 0.05 on that model)."""
    torch.manual_seed(0)
    _, qdq = qdq_model(nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                     nn.ConvTranspose2d(16, 8, 2, stride=2)).eval(), (torch.randn(1, 3, 8, 8),))
    imported = import_onnx(qdq)
    assert any(n.op == "DequantizeLinear" and n.inputs[0] in imported.constants for n in imported.nodes)
    graph = optimize(imported)
    assert not [n.name for n in graph.nodes if n.op == "DequantizeLinear" and n.inputs[0] in graph.constants]
    assert "ConvTranspose" not in {n.op for n in graph.nodes}
