"""The ONNX frontend against ONNX Runtime: per-op and per-opset forms, auto_pad, the batch symbol, errors.

Expected values always come from ONNX Runtime (one thread, no graph optimisation), never from Cuvil.
"""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from cuvil.compiler import N, CuvilError, run_reference
from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends.onnx import BatchDependentError, OnnxImportError, import_onnx

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def make_model(nodes, inputs, outputs, inits=None, opset=17, name="g"):
    """``inputs``: name -> (ONNX dtype, shape); ``outputs``: names; ``inits``: name -> array."""
    vis = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    tensors = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    model = helper.make_model(helper.make_graph(nodes, name, vis, outs, tensors),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


def run_ort(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def check(model, feeds, batch_size=None, rtol=1e-4, atol=1e-5):
    """Import ``model``, run both, compare the outputs in order; return the Cuvil graph.

    (Outputs keep their ONNX names, verbatim; the comparison goes by position.)
    """
    graph = import_onnx(model, batch_size=batch_size)
    expected = run_ort(model, feeds)
    actual = run_reference(graph, feeds)
    assert len(actual) == len(expected)
    for cuvil_name, (name, want) in zip(graph.outputs, expected.items()):
        got = actual[cuvil_name]
        assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, got.dtype, want.shape, want.dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    return graph


def one_op(op, x_shape, opset, inits=None, extra_inputs=(), n_out=1, x_dtype=F, **attrs):
    """A model with one node over input ``x`` (plus initializers / '' placeholders in ``extra_inputs``)."""
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, ["x", *extra_inputs], outs, **attrs)
    return make_model([node], {"x": (x_dtype, x_shape)}, outs, inits, opset)


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


# --- ops whose signature changed between opsets ---------------------------------------------------

CLIP = [
    (9, {}, (), {"min": 0.0, "max": 6.0}),
    (9, {}, (), {"max": 0.5}),
    (11, {"lo": np.float32(-0.5), "hi": np.float32(0.5)}, ("lo", "hi"), {}),
    (13, {"hi": np.float32(6.0)}, ("", "hi"), {}),
    (17, {"lo": np.float32(0.0)}, ("lo",), {}),
    (21, {}, (), {}),
]


@pytest.mark.parametrize("opset,inits,extra,attrs", CLIP)
def test_clip_every_signature(rng, opset, inits, extra, attrs):
    check(one_op("Clip", [2, 5], opset, inits, extra, **attrs), {"x": rand(rng, 2, 5) * 4})


PADS = [
    (9, {}, (), {"pads": [0, 1, 2, 0, 1, 0], "value": 1.5}),
    (9, {}, (), {"pads": [0, 1, 1, 0, 1, 1], "mode": "reflect"}),
    (11, {"p": np.array([0, 0, 1, 0, 2, 1], np.int64)}, ("p",), {"mode": "edge"}),
    (13, {"p": np.array([0, 1, 0, 0, 0, 2], np.int64), "v": np.float32(-3)}, ("p", "v"), {}),
    (18, {"p": np.array([1, 2, 0, 1], np.int64), "v": np.float32(2), "ax": np.array([-2, 2], np.int64)},
     ("p", "v", "ax"), {}),
    (21, {"p": np.array([0, 0, -1, 0, 0, 1], np.int64)}, ("p",), {}),
    (19, {"p": np.array([1, 0, 3, 2, 3, 4], np.int64)}, ("p",), {"mode": "wrap"}),
]


@pytest.mark.parametrize("opset,inits,extra,attrs", PADS)
def test_pad_every_signature(rng, opset, inits, extra, attrs):
    check(one_op("Pad", [2, 3, 4], opset, inits, extra, **attrs), {"x": rand(rng, 2, 3, 4)})


SPLITS = [
    (9, {}, (), 2, {"axis": 1, "split": [1, 4]}),
    (11, {}, (), 5, {"axis": -1}),
    (13, {"s": np.array([2, 3], np.int64)}, ("s",), 2, {"axis": 1}),
    (17, {}, (), 5, {"axis": 1}),
    (18, {}, (), 3, {"axis": 1, "num_outputs": 3}),  # uneven: 2, 2, 1
    (21, {"s": np.array([3, 1, 1], np.int64)}, ("s",), 3, {"axis": 2}),
]


@pytest.mark.parametrize("opset,inits,extra,n_out,attrs", SPLITS)
def test_split_every_signature(rng, opset, inits, extra, n_out, attrs):
    check(one_op("Split", [2, 5, 5], opset, inits, extra, n_out=n_out, **attrs), {"x": rand(rng, 2, 5, 5)})


@pytest.mark.parametrize("opset", [9, 11, 13, 21])
def test_squeeze_unsqueeze_every_signature(rng, opset):
    inits = {}

    def node(op, x, out, axes):  # axes: an attribute before opset 13, an input from it
        if opset < 13:
            return helper.make_node(op, [x], [out], axes=axes)
        inits[f"{out}_axes"] = np.array(axes, np.int64)
        return helper.make_node(op, [x, f"{out}_axes"], [out])

    nodes = [node("Squeeze", "x", "s", [1, -1]), node("Unsqueeze", "s", "u", [0, -1]),
             helper.make_node("Squeeze", ["u"], ["all"])]  # no axes: every 1-sized dim
    model = make_model(nodes, {"x": (F, [3, 1, 4, 1])}, ["u", "all"], inits, opset)
    check(model, {"x": rand(rng, 3, 1, 4, 1)})


@pytest.mark.parametrize("opset", [9, 11, 13, 17, 18, 21])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
def test_reduce_every_signature(rng, op, opset):
    from_input = opset >= {"ReduceSum": 13}.get(op, 18)
    nodes, inits = [], {}
    for i, (axes, keep) in enumerate([([1, -1], 1), ([0], 0), (None, 0)]):
        ins, attrs = ["x"], {"keepdims": keep}
        if axes is not None and from_input:
            inits[f"a{i}"] = np.array(axes, np.int64)
            ins.append(f"a{i}")
        elif axes is not None:
            attrs["axes"] = axes
        nodes.append(helper.make_node(op, ins, [f"y{i}"], **attrs))
    if from_input:  # noop_with_empty_axes exists exactly where axes became an input
        nodes.append(helper.make_node(op, ["x"], ["y3"], noop_with_empty_axes=1))
    model = make_model(nodes, {"x": (F, [2, 3, 4])}, [n.output[0] for n in nodes], inits, opset)
    check(model, {"x": rand(rng, 2, 3, 4)})


@pytest.mark.parametrize("opset", [9, 11, 13, 17, 21])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_softmax_coerces_to_2d_before_opset_13(rng, op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(one_op(op, [2, 3, 4], opset, **attrs), {"x": rand(rng, 2, 3, 4)})


@pytest.mark.parametrize("opset", [9, 13])
def test_slice_attr_and_input_forms(rng, opset):
    if opset < 10:
        model = one_op("Slice", [4, 6], opset, starts=[1, -4], ends=[100, -1], axes=[0, 1])
    else:
        big = np.iinfo(np.int64).max
        inits = {"s": np.array([-1, 1], np.int64), "e": np.array([-big, big], np.int64),
                 "a": np.array([0, 1], np.int64), "st": np.array([-2, 3], np.int64)}
        model = one_op("Slice", [4, 6], opset, inits, ("s", "e", "a", "st"))
    check(model, {"x": rand(rng, 4, 6)})


# --- Conv and pooling padding ---------------------------------------------------------------------


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("op", ["Conv", "MaxPool", "AveragePool"])
def test_auto_pad_resolves_to_explicit_pads(rng, op, auto_pad):
    attrs = {"auto_pad": auto_pad, "strides": [2, 1]}
    if auto_pad == "NOTSET":
        attrs["pads"] = [1, 0, 0, 1]
    inits, extra = {}, ()
    if op == "Conv":
        inits, extra = {"w": rand(rng, 4, 3, 2, 2), "b": rand(rng, 4)}, ("w", "b")
    else:  # even kernels: odd total padding, so SAME_UPPER and SAME_LOWER differ
        attrs["kernel_shape"] = [2, 2]
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    check(one_op(op, [1, 3, 7, 6], 11, inits, extra, **attrs), {"x": rand(rng, 1, 3, 7, 6)})


def test_conv_defaults_group_and_dilation(rng):
    inits = {"w": rand(rng, 6, 2, 3, 3)}
    model = one_op("Conv", [1, 4, 9, 9], 9, inits, ("w",), group=2, dilations=[2, 1], pads=[1, 1, 1, 1])
    check(model, {"x": rand(rng, 1, 4, 9, 9)})


# --- the other ops, one model each -----------------------------------------------------------------

ELEMENTWISE = [
    ("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Erf", {}), ("Exp", {}), ("Neg", {}), ("Abs", {}),
    ("Identity", {}), ("HardSwish", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ("LeakyRelu", {"alpha": 0.2}), ("Flatten", {"axis": 2}), ("Transpose", {}), ("Transpose", {"perm": [1, 2, 0]}),
    ("GlobalMaxPool", {}), ("GlobalAveragePool", {}), ("Dropout", {}),
]


@pytest.mark.parametrize("op,attrs", ELEMENTWISE)
def test_single_input_ops(rng, op, attrs):
    check(one_op(op, [2, 3, 4], 14, **attrs), {"x": rand(rng, 2, 3, 4)})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset_20(rng, approximate):
    check(one_op("Gelu", [3, 5], 20, approximate=approximate), {"x": rand(rng, 3, 5)})


def test_arithmetic_comparisons_and_where(rng):
    inits = {"c": rand(rng, 4), "two": np.array(2, np.int64), "eps": np.float32(1e-3)}
    table = [  # (op, inputs, output); Pow gets an int64 exponent, as some exporters write
        ("Abs", ["x"], "ax"), ("Add", ["ax", "eps"], "pos"), ("Sqrt", ["pos"], "sq"), ("Log", ["pos"], "lg"),
        ("Reciprocal", ["pos"], "rc"), ("Pow", ["x", "two"], "pw"), ("Div", ["x", "pos"], "dv"),
        ("Sub", ["x", "c"], "sb"), ("Sum", ["x", "c", "sq"], "sm"), ("Max", ["x", "c"], "mx"),
        ("Min", ["x", "c", "lg"], "mn"), ("Greater", ["x", "c"], "gt"), ("Less", ["x", "c"], "lt"),
        ("Equal", ["gt", "lt"], "eq"), ("Where", ["gt", "x", "c"], "wh"), ("PRelu", ["x", "c"], "pr"),
        ("CastLike", ["eq", "x"], "castlike"),
    ]
    nodes = [helper.make_node(op, ins, [out]) for op, ins, out in table]
    nodes.append(helper.make_node("Cast", ["gt"], ["cast"], to=TensorProto.INT32))
    outs = [n.output[0] for n in nodes]
    check(make_model(nodes, {"x": (F, [3, 4])}, outs, inits, 15), {"x": rand(rng, 3, 4)})


def test_gather_concat_expand_matmul_gemm(rng):
    inits = {"idx": np.array([[2, 0], [1, 1]], np.int64), "w": rand(rng, 4, 5), "g": rand(rng, 5, 4),
             "gc": rand(rng, 5), "shape": np.array([2, 3, 4], np.int64)}
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["ga"], axis=0),
        helper.make_node("Gather", ["x", "idx"], ["gb"], axis=-1),
        helper.make_node("Concat", ["x", "x"], ["cat"], axis=-1),
        helper.make_node("Expand", ["x", "shape"], ["ex"]),
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Gemm", ["x", "g", "gc"], ["gm"], alpha=0.5, beta=2.0, transB=1),
    ]
    check(make_model(nodes, {"x": (F, [3, 4])}, [n.output[0] for n in nodes], inits, 13), {"x": rand(rng, 3, 4)})


def test_norms_and_lrn(rng):
    c = 4
    inits = {"s": rand(rng, c) + 2, "b": rand(rng, c), "m": rand(rng, c), "v": np.abs(rand(rng, c)) + 0.5,
             "ls": rand(rng, 5), "lb": rand(rng, 5)}
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], epsilon=1e-3),
        helper.make_node("LRN", ["x"], ["lrn"], size=3, alpha=1e-3, beta=0.7, bias=1.5),
        helper.make_node("LayerNormalization", ["x", "ls", "lb"], ["ln"], axis=-1, epsilon=1e-4),
        helper.make_node("LayerNormalization", ["x", "ls"], ["ln2"], axis=1),
    ]
    model = make_model(nodes, {"x": (F, [2, c, 3, 5])}, ["bn", "lrn", "ln", "ln2"], inits, 17)
    check(model, {"x": rand(rng, 2, c, 3, 5)})


def test_constants_fold_away(rng):
    tensor = numpy_helper.from_array(np.array([2, -1], np.int64))
    fill = numpy_helper.from_array(np.array([0.25], np.float32))
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=tensor),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Constant", [], ["ints"], value_ints=[3, 4]),
        helper.make_node("ConstantOfShape", ["ints"], ["quarter"], value=fill),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Shape", ["x"], ["tail"], start=-1),
        helper.make_node("Size", ["x"], ["size"]),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Mul", ["x", "half"], ["h"]),
        helper.make_node("Add", ["h", "quarter"], ["y"]),
    ]
    graph = check(make_model(nodes, {"x": (F, [3, 4])}, ["y", "r", "xs", "tail", "size"], None, 15),
                  {"x": rand(rng, 3, 4)})
    assert {n.op for n in graph.nodes} <= {"Mul", "Add", "Reshape", "Identity"}


def test_input_that_is_also_an_initializer_is_a_constant(rng):
    model = one_op("Add", [2, 3], 9, {"b": rand(rng, 2, 3)}, ("b",))
    model.graph.input.append(helper.make_tensor_value_info("b", F, [2, 3]))
    graph = check(model, {"x": rand(rng, 2, 3)})
    assert graph.inputs == ("x",) and "b" in graph.constants


def test_names_come_from_the_onnx_graph(rng):
    graph = import_onnx(one_op("Relu", [2], 13).SerializeToString())
    assert graph.name == "g" and graph.inputs == ("x",) and graph.outputs == ("y0",)


# --- the batch dimension --------------------------------------------------------------------------


def _flatten_by_shape_chain(opset):
    """x.view(x.size(0), -1) as exporters write it, then a Softmax (coerced before opset 13)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]) if opset < 13 else
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Mul", ["n", "three"], ["n3"]),
        helper.make_node("Div", ["n3", "three"], ["n_again"]),
        helper.make_node("Unsqueeze", ["n_again"], ["m1"], axes=[0]) if opset < 13 else
        helper.make_node("Unsqueeze", ["n_again", "ax0"], ["m1"]),
        helper.make_node("Concat", ["m1", "four", "minus1"], ["target2"], axis=0),
        helper.make_node("Reshape", ["x", "target2"], ["r2"]),
        helper.make_node("Softmax", ["r2"], ["y"], axis=1),
    ]
    inits = {"zero": np.array(0, np.int64), "minus1": np.array([-1], np.int64), "ax0": np.array([0], np.int64),
             "three": np.array(3, np.int64), "four": np.array([4], np.int64)}
    return make_model(nodes, {"x": (F, ["batch", 4, 2, 3])}, ["flat", "y"], inits, opset)


@pytest.mark.parametrize("opset", [9, 13])
def test_symbolic_batch_becomes_n_through_shape_chains(rng, opset):
    model = _flatten_by_shape_chain(opset)
    graph = import_onnx(model)
    assert graph.types["x"].shape == (N, 4, 2, 3) and graph.types["flat"].shape == (N, 24)
    assert "Shape" not in {n.op for n in graph.nodes}
    for batch in (1, 3):
        check(model, {"x": rand(rng, batch, 4, 2, 3)})


def test_batch_size_binds_statically(rng):
    graph = check(_flatten_by_shape_chain(13), {"x": rand(rng, 2, 4, 2, 3)}, batch_size=2)
    assert graph.types["x"].shape == (2, 4, 2, 3)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter is deprecated
def test_torch_export_with_dynamic_batch(rng):
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4 * 4 * 4, 5)

        def forward(self, x):
            x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
            return torch.softmax(self.fc(x.view(x.size(0), -1)), dim=1)

    import io

    buf = io.BytesIO()
    torch.onnx.export(Net().eval(), torch.zeros(2, 3, 8, 8), buf, dynamo=False, opset_version=13,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    from onnx import load_model_from_string

    model = load_model_from_string(buf.getvalue())
    for batch in (1, 3):
        check(model, {"x": rand(rng, batch, 3, 8, 8)})


def test_batch_dependent_values_that_cannot_be_expressed_name_batch_size():
    one = numpy_helper.from_array(np.ones(1, np.float32))
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["ones"], value=one),
             helper.make_node("Add", ["x", "ones"], ["y"])]
    with pytest.raises(BatchDependentError, match="batch_size"):
        import_onnx(make_model(nodes, {"x": (F, ["b", 3])}, ["y"]))


def test_other_symbolic_dims_are_a_clear_error():
    with pytest.raises(OnnxImportError, match="dimension 2 is symbolic.*static shapes"):
        import_onnx(one_op("Relu", ["b", 3, "h"], 13))


# --- errors: one for everything unsupported, typed for the rest ------------------------------------


def test_one_error_names_every_unsupported_op_and_node():
    nodes = [helper.make_node("Unique", ["x"], ["r"], name="up1"),
             helper.make_node("Relu", ["r"], ["a"], name="act"),
             helper.make_node("TfIdfVectorizer", ["x"], ["f"], name="floor1"),
             helper.make_node("Unique", ["f"], ["r2"], name="up2"),
             helper.make_node("Add", ["a", "r2"], ["y"], name="sum")]
    model = make_model(nodes, {"x": (F, [1, 1, 2, 2])}, ["y"], opset=13)
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(model)
    assert err.value.unsupported == {"TfIdfVectorizer": ("floor1",), "Unique": ("up1", "up2")}
    for word in ("TfIdfVectorizer", "Unique", "up1", "up2", "floor1"):
        assert word in str(err.value)


def test_unsupported_forms_domains_dtypes_and_used_extra_outputs_are_collected():
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"], name="drop"),  # its mask imports: all true
             helper.make_node("Cast", ["mask"], ["mf"], to=F),
             helper.make_node("FusedGemm", ["x", "x"], ["fg"], name="ms", domain="com.microsoft"),
             helper.make_node("Cast", ["x"], ["bf"], name="tobf", to=TensorProto.COMPLEX64),
             helper.make_node("Reshape", ["x", "x_shape"], ["rs"], name="dyn"),
             helper.make_node("BatchNormalization", ["x4", "c", "c", "c", "c"], ["bn", "mean"], name="bnorm"),
             helper.make_node("Add", ["d", "mf"], ["y"])]
    inputs = {"x": (F, [2, 2]), "x_shape": (I64, [2]), "x4": (F, [1, 1, 2, 2])}
    model = make_model(nodes, inputs, ["y", "fg", "bf", "rs", "bn", "mean"], {"c": np.ones(1, np.float32)}, opset=11)
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(model)
    assert err.value.unsupported == {
        "com.microsoft.FusedGemm": ("ms",), "Cast (dtype COMPLEX64)": ("tobf",),
        "Reshape (input 1 must be a constant)": ("dyn",), "BatchNormalization (output 1)": ("bnorm",)}
    assert err.value.constant_inputs == ("x_shape",) and "constant_inputs" in str(err.value)


@pytest.mark.parametrize("data", [b"\x08\x07garbage\xff\xff", b"", b"not an onnx model at all"])
def test_malformed_bytes_are_a_cuvil_error(data):
    with pytest.raises(CuvilError):
        import_onnx(data)


def test_missing_file_and_bad_opsets_are_cuvil_errors(tmp_path):
    with pytest.raises(OnnxImportError, match="cannot read"):
        import_onnx(tmp_path / "nope.onnx")
    for opset in (0, 999):
        with pytest.raises(OnnxImportError, match="opset"):
            import_onnx(one_op("Relu", [2], opset))
    path = tmp_path / "m.onnx"
    path.write_bytes(one_op("Relu", [2], 13).SerializeToString())
    assert import_onnx(str(path)).outputs == ("y0",)


def test_a_model_that_fixes_the_batch_suggests_batch_size(rng):
    """Old zoo models reshape to [1, 9216] while declaring a symbolic batch: batch_size=1 imports them."""
    model = one_op("Reshape", ["N", 2, 3], 9, {"s": np.array([1, 6], np.int64)}, ("s",))
    with pytest.raises(OnnxImportError, match="batch_size"):
        import_onnx(model)
    check(model, {"x": rand(rng, 1, 2, 3)}, batch_size=1)


@settings(max_examples=150, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_corrupted_models_raise_only_cuvil_errors(flips, cut):
    data = bytearray(_flatten_by_shape_chain(9).SerializeToString())
    for pos, byte in flips:
        data[pos % len(data)] = byte
    try:
        import_onnx(bytes(data[:cut]))
    except CuvilError:
        pass


@pytest.mark.parametrize("dims", [[2, 3, 4], ["batch", 3, 4]])
def test_shape_arithmetic_outside_op_set_v1_folds(rng, dims):
    """TF-style flatten (ReduceProd of the trailing dims) and Mod/Range/Floor over constants."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "one", "big"], ["tail"]),
        helper.make_node("ReduceProd", ["tail"], ["features"], keepdims=1),
        helper.make_node("Slice", ["s", "zero", "one"], ["head"]),
        helper.make_node("Concat", ["head", "features"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Range", ["zero_s", "twelve", "one_s"], ["r"]),
        helper.make_node("Mod", ["r", "five"], ["m"]),
        helper.make_node("Cast", ["m"], ["mf"], to=F),
        helper.make_node("Floor", ["mf"], ["fl"]),
        helper.make_node("Add", ["flat", "fl"], ["y"]),
    ]
    ints = {"one": [1], "big": [100], "zero": [0], "zero_s": 0, "twelve": 12, "one_s": 1, "five": 5}
    inits = {k: np.array(v, np.int64) for k, v in ints.items()}
    model = make_model(nodes, {"x": (F, dims)}, ["y"], inits, 13)
    graph = import_onnx(model)
    assert {n.op for n in graph.nodes} == {"Reshape", "Add"}
    for batch in (1, 3) if dims[0] == "batch" else (2,):
        check(model, {"x": rand(rng, batch, 3, 4)})


def test_a_constant_expanded_far_beyond_its_size_is_computed_not_stored(rng):
    """ConstantOfShape + Expand to 2 MiB: folded, every device would store (and load) 2 MiB of one
    number; kept as nodes, the weights hold a few bytes."""
    shape = np.array([1, 32, 128, 128], np.int64)
    nodes = [helper.make_node("ConstantOfShape", ["shp"], ["z"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.25])),
             helper.make_node("Expand", ["half", "shp"], ["e"]),
             helper.make_node("Add", ["x", "z"], ["a"]), helper.make_node("Mul", ["a", "e"], ["y"])]
    model = make_model(nodes, {"x": (F, [int(d) for d in shape])}, ["y"], {"shp": shape, "half": np.array([0.5], np.float32)})
    graph = check(model, {"x": rand(rng, *shape)})
    assert sum(v.nbytes for v in graph.constants.values()) < 1024


@pytest.mark.parametrize("op", ["If", "Loop", "Scan"])
def test_unsupported_op_errors_say_what_to_do_instead(op):
    from cuvil.compiler.frontends.onnx import HINTS

    error = UnsupportedModelError({op: ["n"]}, source="ONNX model 'g'", hints=HINTS)
    assert re.fullmatch(rf"ONNX model 'g' uses 1 unsupported op\(s\): {op} \(used by n\)\. Control flow imports by unrolling.*",
                        str(error))


def test_an_op_without_advice_gets_none():
    model = make_model([helper.make_node("Unique", ["x"], ["y"])], {"x": (F, [1, 4])}, ["y"])
    with pytest.raises(UnsupportedModelError) as e:
        import_onnx(model)
    assert str(e.value) == "ONNX model 'g' uses 1 unsupported op(s): Unique (used by y)"
