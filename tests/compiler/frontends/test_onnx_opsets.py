"""Opsets the way ONNX Runtime takes them: any opset the installed onnx knows, op versions declared
per translator, old models lifted, ONNX functions expanded, graph inputs fixed as constants.

Expected values come from ONNX Runtime or NumPy, never from Cuvil.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx.defs
import pytest
from onnx import TensorProto, helper

from cuvil.compiler import run_reference
from cuvil.compiler.ops import OP_TABLE
from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends import onnx_ops
from cuvil.compiler.frontends.onnx import LIFTED_TO, NEWEST_OPSET, OnnxImportError, import_onnx
from cuvil.edge_runtime.compile import compile_graph
from tests.compiler.frontends.test_onnx_frontend import check, make_model, one_op, run_ort

F, I64 = TensorProto.FLOAT, TensorProto.INT64
SINCE = collections.defaultdict(set)
for _schema in onnx.defs.get_all_schemas_with_history():
    if _schema.domain == "":
        SINCE[_schema.name].add(_schema.since_version)


def test_declared_versions_are_onnx_versions_and_include_the_newest():
    assert onnx_ops.VERSIONS.keys() == onnx_ops.TABLE.keys()
    assert set(onnx_ops.DIRECT_VERSIONS) == {name for name, op in OP_TABLE.items() if op.same_as_onnx}
    for op, versions in onnx_ops.VERSIONS.items():
        assert set(versions) <= SINCE[op], (op, sorted(set(versions) - SINCE[op]))
        assert max(SINCE[op]) in versions, f"{op}: its newest version {max(SINCE[op])} is not declared"


@pytest.mark.parametrize("opset", sorted({9, 11, 13, 17, 21, 22, NEWEST_OPSET}))
def test_every_opset_up_to_the_newest_imports(rng, opset):
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    model = make_model(nodes, {"x": (F, [1, 3, 5, 5])}, ["y"], {"w": w}, opset)
    check(model, {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32)})


def test_models_below_opset_9_are_lifted_first(rng):
    """BatchNormalization-7 (with its spatial attribute) and Upsample-free ops, converted to opset 9."""
    c = 3
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], spatial=1, epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["y"])]
    inits = {"s": rng.random(c, np.float32) + 0.5, "b": rng.standard_normal(c).astype(np.float32),
             "m": rng.standard_normal(c).astype(np.float32), "v": rng.random(c, np.float32) + 0.5}
    model = make_model(nodes, {"x": (F, [2, c, 4, 4]), **{k: (F, [c]) for k in inits}}, ["y"], inits, opset=7)
    model.ir_version = 3  # initializers are graph inputs too, as IR 3 wants
    graph = import_onnx(model)
    x = rng.standard_normal((2, c, 4, 4)).astype(np.float32)
    shape = (1, c, 1, 1)
    want = np.maximum((x - inits["m"].reshape(shape)) / np.sqrt(inits["v"].reshape(shape) + 1e-3)
                      * inits["s"].reshape(shape) + inits["b"].reshape(shape), 0)
    np.testing.assert_allclose(run_reference(graph, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert LIFTED_TO == 9


def test_an_undeclared_op_version_is_unsupported_and_named(monkeypatch):
    monkeypatch.setitem(onnx_ops.VERSIONS, "Sqrt", (6,))
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(one_op("Sqrt", [3], 13))
    assert err.value.unsupported == {"Sqrt (version 13)": ("y0",)}


def test_an_op_onnx_defines_as_a_function_is_expanded(rng, monkeypatch):
    """LeakyRelu-16 has a function body in onnx.defs: without its version declared, the body imports."""
    monkeypatch.setitem(onnx_ops.VERSIONS, "LeakyRelu", (6,))
    graph = check(one_op("LeakyRelu", [2, 5], 16, alpha=0.3), {"x": rng.standard_normal((2, 5)).astype(np.float32)})
    assert "LeakyRelu" not in {n.op for n in graph.nodes}


def test_a_context_dependent_function_is_expanded_with_the_input_types(rng):
    """RMSNormalization (opset 23) has no translator: ONNX builds its body for the node's types."""
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    scale = rng.standard_normal(8).astype(np.float32)
    model = make_model([helper.make_node("RMSNormalization", ["x", "s"], ["y"], epsilon=1e-5)],
                       {"x": (F, [2, 3, 8])}, ["y"], {"s": scale}, 23)
    graph = import_onnx(model)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(run_reference(graph, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("outputs", [["y", "mean", "inv_std"], ["y", "mean"], ["y", "", "inv_std"]])
def test_outputs_a_translator_does_not_give_come_from_the_function_body(rng, outputs):
    """LayerNormalization's Mean and InvStdDev: Y stays the translator's one op, the body adds the rest
    (the body defined Y a second time, and the import failed: 'output y cannot keep its name')."""
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], outputs, axis=1)
    model = make_model([node], {"x": (F, [2, 3, 5])}, [o for o in outputs if o],
                       {"s": rng.standard_normal((3, 5)).astype(np.float32), "b": np.ones((3, 5), np.float32)})
    graph = check(model, {"x": x})
    assert [n.op for n in graph.nodes].count("LayerNormalization") == 1
    native = compile_graph(graph, use_cache=False).run({"x": x})
    for name, want in zip(graph.outputs, run_ort(model, {"x": x}).values()):
        np.testing.assert_allclose(native[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def _reshape_model():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")]
    return make_model(nodes, {"x": (F, [2, 6]), "shape": (I64, [2])}, ["y"], opset=13)


def test_a_graph_input_an_op_needs_constant_is_named_and_can_be_fixed(rng):
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(_reshape_model())
    assert err.value.constant_inputs == ("shape",)
    graph = import_onnx(_reshape_model(), constant_inputs={"shape": np.array([3, 4], np.int64)})
    assert graph.inputs == ("x",)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], x.reshape(3, 4))


def test_an_integer_input_behind_shape_arithmetic_is_named_and_can_be_fixed(rng):
    """A crop size passed as an input reaches Pad and Slice through Max, Sub, Div, Concat: the
    input is named; data reaching an op through float values (a computed scale) is never named."""
    k2 = helper.make_tensor("k2", I64, [1], [2])
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Max", ["xs", "size"], ["big"]),
             helper.make_node("Sub", ["big", "xs"], ["grow"]), helper.make_node("Div", ["grow", "k2"], ["lo"]),
             helper.make_node("Sub", ["grow", "lo"], ["hi"]), helper.make_node("Concat", ["lo", "hi"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["y"])]
    model = make_model(nodes, {"x": (F, [3, 5]), "size": (I64, [2])}, ["y"], opset=18)
    model.graph.initializer.append(k2)
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(model)
    assert err.value.constant_inputs == ("size",)
    graph = import_onnx(model, constant_inputs={"size": np.array([6, 4], np.int64)})
    x = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], np.pad(x, [(1, 2), (0, 0)]))
    scale = [helper.make_node("ReduceMax", ["x", "axis1"], ["m"], keepdims=0),  # per-axis: must be constant
             helper.make_node("QuantizeLinear", ["x", "m"], ["q"], axis=0)]
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(make_model(scale, {"x": (F, [3, 5])}, ["q"], {"axis1": np.array([1], np.int64)}, opset=18))
    assert err.value.constant_inputs == ()


@pytest.mark.parametrize("given, match", [({"nope": np.zeros(2, np.int64)}, "not inputs"),
                                          ({"shape": np.zeros(2, np.int32)}, "int32"),
                                          ({"shape": np.zeros(3, np.int64)}, r"\[3\]")])
def test_bad_constant_inputs_are_import_errors(given, match):
    with pytest.raises(OnnxImportError, match=match):
        import_onnx(_reshape_model(), constant_inputs=given)


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_onnx_defines_as_functions_import_at_every_opset(op, opset, keepdims):
    """Before opset 18 ONNX gives these no function body (``F.normalize``, ``torch.norm`` and ``logsumexp``
    export them at 17): natively against ONNX Runtime, LogSumExp over values whose exp overflows, over
    a row of -inf and one holding +inf, as ORT's stable form gives."""
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    if op == "ReduceLogSumExp":
        x[0] *= 200.0
        x[:, 3, :], x[2, 1, 3] = -np.inf, np.inf
    axes = np.array([0, 2], np.int64)
    if opset >= 18:
        model = one_op(op, x.shape, opset, {"axes": axes}, ("axes",), keepdims=keepdims)
    else:
        model = one_op(op, x.shape, opset, axes=axes.tolist(), keepdims=keepdims)
    want = run_ort(model, {"x": x})["y0"]
    graph = import_onnx(model)
    for got in (run_reference(graph, {"x": x}), compile_graph(graph, use_cache=False).run({"x": x})):
        np.testing.assert_allclose(got[graph.outputs[0]], want, rtol=2e-6, atol=1e-6)
