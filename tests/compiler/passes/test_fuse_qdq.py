"""fuse_qdq: QDQ patterns become integer ops that compute within one quantum of the float pattern."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, Node, TensorType, run_reference
from cuvil.compiler.ir.types import N
from cuvil.compiler.passes.dce import dce
from cuvil.compiler.passes.fuse_qdq import fuse_qdq

from .graphs import graph

U8 = DType.U8


def dq(x, out, scale, zp=(0,), axis=1):
    return Node.make("DequantizeLinear", [x], [out], scale=scale, zero_point=zp, axis=axis)


def q(x, out, scale, zp=(0,), to=U8):
    return Node.make("QuantizeLinear", [x], [out], scale=scale, zero_point=zp, to=to)


def _conv_graph(act: Node | None, w_zp=0):
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    b = rng.integers(-300, 300, (8,)).astype(np.int32)
    ws = tuple(float(v) for v in rng.uniform(0.002, 0.01, 8).astype(np.float32))
    bs = tuple(float(np.float32(0.05) * np.float32(s)) for s in ws)
    conv_out = "c" if act is None else "pre"
    nodes = [q("x", "xq", [0.05], [128]), dq("xq", "xf", [0.05], [128]),
             dq("w", "wf", ws, [w_zp] * 8, axis=0), dq("b", "bf", bs, [0] * 8, axis=0),
             Node.make("Conv", ["xf", "wf", "bf"], [conv_out], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1])]
    nodes += [act] if act is not None else []
    nodes += [q("c", "cq", [0.1], [10]), dq("cq", "y", [0.1], [10])]
    return graph({"x": TensorType(DType.F32, (N, 4, 6, 6))}, {"w": w, "b": b}, nodes, ["y"])


def _check_close(before, after, quantum, batch=3):
    x = np.random.default_rng(1).standard_normal((batch, 4, 6, 6)).astype(np.float32) * 3
    want, got = run_reference(before, {"x": x})["y"], run_reference(after, {"x": x})["y"]
    assert np.abs(got - want).max() <= quantum * 1.0001
    assert np.mean(got == want) > 0.97


def test_conv_relu_becomes_one_qconv_with_the_relu_as_clamp():
    before = _conv_graph(Node.make("Relu", ["pre"], ["c"]))
    after = dce(fuse_qdq(before))
    ops = [n.op for n in after.nodes]
    assert ops == ["QuantizeLinear", "QConv", "DequantizeLinear"]
    qconv = after.nodes[1]
    assert qconv.attr["clamp"] == (10, 255) and after.types[qconv.outputs[0]].dtype is U8
    assert after.constants["w"].dtype == np.int8 and after.weight_bytes < before.weight_bytes + 64
    _check_close(before, after, 0.1)


def test_clip_becomes_a_two_sided_clamp():
    before = _conv_graph(Node.make("Clip", ["pre"], ["c"], min=0.0, max=6.0))
    after = dce(fuse_qdq(before))
    assert after.nodes[1].attr["clamp"] == (10, 70)  # Q(0) = 10, Q(6) = 6 / 0.1 + 10
    _check_close(before, after, 0.1)


def test_asymmetric_weights_stay_float():
    before = _conv_graph(None, w_zp=3)
    assert [n.op for n in fuse_qdq(before).nodes] == [n.op for n in before.nodes]


def test_gemm_with_trans_b_and_add_and_maxpool_fuse():
    rng = np.random.default_rng(3)
    w = rng.integers(-127, 128, (5, 16)).astype(np.int8)  # [N, K], transB
    nodes = [q("x", "xq", [0.04], [120]), dq("xq", "xf", [0.04], [120]), dq("w", "wf", [0.01] * 5, [0] * 5, axis=0),
             Node.make("Gemm", ["xf", "wf"], ["g"], transB=1), q("g", "gq", [0.05], [128]),
             dq("gq", "ga", [0.05], [128]), dq("gq", "gb", [0.05], [128]),
             Node.make("Add", ["ga", "gb"], ["s"]), Node.make("Relu", ["s"], ["r"]), q("r", "rq", [0.1], [0]),
             dq("rq", "y", [0.1], [0])]
    before = graph({"x": TensorType(DType.F32, (N, 16))}, {"w": w}, nodes, ["y"])
    after = dce(fuse_qdq(before))
    assert [n.op for n in after.nodes] == ["QuantizeLinear", "QMatMul", "QAdd", "DequantizeLinear"]
    assert after.constants[after.nodes[1].inputs[1]].shape == (16, 5)
    x = rng.standard_normal((4, 16)).astype(np.float32) * 2
    want, got = run_reference(before, {"x": x})["y"], run_reference(after, {"x": x})["y"]
    assert np.abs(got - want).max() <= 0.1 * 1.0001

    pool = [q("x", "xq", [0.04], [120]), dq("xq", "xf", [0.04], [120]),
            Node.make("MaxPool", ["xf"], ["p"], kernel_shape=[2, 2], strides=[2, 2], pads=[0] * 4, dilations=[1, 1]),
            q("p", "pq", [0.04], [120]), dq("pq", "y", [0.04], [120])]
    before = graph({"x": TensorType(DType.F32, (N, 2, 4, 4))}, {}, pool, ["y"])
    after = dce(fuse_qdq(before))
    assert [n.op for n in after.nodes] == ["QuantizeLinear", "MaxPool", "DequantizeLinear"]
    assert after.types[after.nodes[1].outputs[0]].dtype is U8
    x = rng.standard_normal((2, 2, 4, 4)).astype(np.float32)
    assert np.array_equal(run_reference(before, {"x": x})["y"], run_reference(after, {"x": x})["y"])


def test_gemm_without_quantize_after_becomes_the_float_output_form():
    """Logits: DQ(x), DQ(w), DQ(int32 bias) -> Gemm -> graph output, with no QuantizeLinear after."""
    rng = np.random.default_rng(4)
    w = rng.integers(-127, 128, (6, 16)).astype(np.int8)  # [N, K], transB
    b = rng.integers(-5000, 5000, (6,)).astype(np.int32)
    ws = [float(v) for v in rng.uniform(0.002, 0.01, 6).astype(np.float32)]
    bs = [float(np.float32(0.04) * np.float32(s)) for s in ws]
    nodes = [q("x", "xq", [0.04], [120]), dq("xq", "xf", [0.04], [120]), dq("w", "wf", ws, [0] * 6, axis=0),
             dq("b", "bf", bs, [0] * 6, axis=0), Node.make("Gemm", ["xf", "wf", "bf"], ["y"], transB=1)]
    before = graph({"x": TensorType(DType.F32, (N, 16))}, {"w": w, "b": b}, nodes, ["y"])
    after = dce(fuse_qdq(before))
    assert [n.op for n in after.nodes] == ["QuantizeLinear", "QMatMul"]
    mm = after.nodes[1]
    assert mm.attr["to"] is DType.F32 and after.types["y"].dtype is DType.F32
    assert np.array_equal(after.constants[mm.inputs[2]], b)  # the int32 bias as it was
    x = rng.standard_normal((4, 16)).astype(np.float32) * 2
    xq = np.clip(np.rint(x / np.float32(0.04)) + 120, 0, 255)
    exact = ((xq - 120) @ w.T.astype(np.float64) + b) * (np.float32(0.04) * np.asarray(ws, np.float32))
    got, unfused = run_reference(after, {"x": x})["y"], run_reference(before, {"x": x})["y"]
    assert got.dtype == np.float32
    assert np.allclose(got, exact, rtol=1e-6, atol=1e-6) and np.allclose(unfused, got, rtol=1e-5, atol=1e-5)


def _concat_graph(second_scale: float):
    nodes = [q("x", "xq", [0.04], [120]), dq("xq", "xa", [0.04], [120]), q("z", "zq", [second_scale], [120]),
             dq("zq", "za", [second_scale], [120]), Node.make("Concat", ["xa", "za"], ["c"], axis=1),
             q("c", "cq", [0.04], [120]), dq("cq", "y", [0.04], [120])]
    ts = {"x": TensorType(DType.F32, (N, 2, 3, 3)), "z": TensorType(DType.F32, (N, 3, 3, 3))}
    return graph(ts, {}, nodes, ["y"])


def test_concat_of_equal_parameters_runs_on_int8_and_compiles_exactly():
    from cuvil.edge_runtime.compile import compile_graph

    before = _concat_graph(0.04)
    after = dce(fuse_qdq(before))
    assert [n.op for n in after.nodes] == ["QuantizeLinear", "QuantizeLinear", "Concat", "DequantizeLinear"]
    assert after.types[after.nodes[2].outputs[0]].dtype is U8
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((2, 2, 3, 3)).astype(np.float32) * 3,
             "z": rng.standard_normal((2, 3, 3, 3)).astype(np.float32) * 3}
    want = run_reference(before, feeds)["y"]
    assert np.array_equal(run_reference(after, feeds)["y"], want)
    got = compile_graph(after, batch=2, optimize=False, use_cache=False, jobs=1).run(feeds)["y"]
    assert np.array_equal(got, want)
    mixed = _concat_graph(0.05)  # operands of other parameters: stays float
    assert "Concat" in [n.op for n in fuse_qdq(mixed).nodes]
    assert all(mixed.types[i].dtype is DType.F32 for n in fuse_qdq(mixed).nodes if n.op == "Concat" for i in n.inputs)


@pytest.mark.parametrize("mode, value", [("constant", 0.0), ("constant", 0.37), ("constant", -50.0), ("reflect", 0.0)])
def test_a_pad_between_the_same_parameters_pads_the_int8_values(mode, value):
    """What the pad adds is the QuantizeLinear's image of its value (0.37 is no whole quantum, -50 clips to the
    lowest), the rest are the int8 values themselves: a TCN's causal pads had run in float."""
    before = graph({"x": TensorType(DType.F32, (N, 3, 6))}, {}, [
        q("x", "xq", [0.05], [128]), dq("xq", "xf", [0.05], [128]),
        Node.make("Pad", ["xf"], ["p"], mode=mode, pads=[0, 0, 2, 0, 0, 1], value=value),
        q("p", "pq", [0.05], [128]), dq("pq", "y", [0.05], [128])], ["y"])
    after = dce(fuse_qdq(before))
    pad = next(n for n in after.nodes if n.op == "Pad")
    assert after.types[pad.inputs[0]].dtype is U8 and [n.op for n in after.nodes].count("QuantizeLinear") == 1
    x = np.random.default_rng(3).standard_normal((2, 3, 6)).astype(np.float32) * 4
    assert np.array_equal(run_reference(after, {"x": x})["y"], run_reference(before, {"x": x})["y"])
