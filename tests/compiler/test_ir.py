"""The IR core: types, canonical nodes, graph equality, the verifier, and the text form.

The text form is what ``cuvil inspect`` shows and what a bundle's manifest holds, so it must
round-trip exactly (print -> parse -> equal), names and floats included, and reject bad text with
a ParseError rather than a crash.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil.compiler import Batch, DType, Graph, N, Node, TensorType, infer_graph_types, parse_graph, print_graph, verify
from cuvil.compiler.errors import ParseError, ShapeError, VerifyError
from cuvil.compiler.ir.text import _attr, _Tokens, parse_type
from cuvil.compiler.ir.types import parse_dim
from cuvil.compiler.ops import AttrKind

F32 = DType.F32


def t(text: str) -> TensorType:
    return TensorType.parse(text)


# --- types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,shape", [("f32[N,3]", (N, 3)), ("i64[]", ()), ("u8[2N,0,5]", (Batch(2), 0, 5))])
def test_tensor_type_text_round_trips(text, shape):
    ty = t(text)
    assert ty.shape == shape and str(ty) == text and t(str(ty)) == ty


def test_tensor_type_sizes_and_binding():
    ty = TensorType(DType.F16, (Batch(2), 3, N))
    assert not ty.is_static and ty.rank == 3
    assert ty.bind(4) == TensorType(DType.F16, (8, 3, 4)) and ty.bind(4).is_static
    assert ty.numel(4) == 96 and ty.nbytes(4) == 192 and TensorType(F32, ()).numel() == 1


@pytest.mark.parametrize("shape", [(-1,), (2.0,), (True,), ("N",)])
def test_tensor_type_rejects_bad_dimensions(shape):
    with pytest.raises(ValueError):
        TensorType(F32, shape)


@pytest.mark.parametrize("text", ["f32[-1]", "f32[N2]", "f32", "q8[3]", "f32[1.5]"])
def test_tensor_type_parse_errors(text):
    with pytest.raises(ParseError):
        t(text)


def test_dims_and_dtypes():
    assert parse_dim("N") == N and parse_dim("3N") == Batch(3) and parse_dim(" 7 ") == 7
    assert str(N) == "N" and str(Batch(2)) == "2N" and Batch(2).bind(5) == 10
    for d in DType:
        assert DType.from_numpy(d.numpy) is d and DType.parse(d.value) is d and d.itemsize == d.numpy.itemsize
    assert DType.from_numpy(np.dtype(">i4")) is DType.I32
    with pytest.raises(ShapeError):
        DType.from_numpy(np.complex64)
    with pytest.raises(ParseError):
        DType.parse("float32")


# --- nodes ----------------------------------------------------------------------------------------


def test_node_make_fills_defaults_sorts_and_coerces():
    node = Node.make("Gemm", ["a", "b"], ["y"], transB=np.int64(1), alpha=2)
    assert node.attrs == (("alpha", 2.0), ("beta", 1.0), ("transA", 0), ("transB", 1))
    assert type(node.attr["alpha"]) is float and type(node.attr["transB"]) is int
    assert node.name == "y" and node.inputs == ("a", "b")
    r = Node.make("Reshape", ("x",), ("y",), name="r", shape=np.array([-1, 4]))
    assert r.attr["shape"] == (-1, 4) and isinstance(r.attr["shape"], tuple) and r.name == "r"
    assert Node.make("Cast", ["x"], ["y"], to="f16").attr["to"] is DType.F16


def test_equal_nodes_are_equal_and_hash_alike():
    a = Node.make("Clip", ["x"], ["y"], min=float("nan"), max=6)
    b = Node.make("Clip", ["x"], ["y"], max=6.0, min=float("nan"))
    assert a == b and hash(a) == hash(b)
    assert a != a.replace(name="other") and a.replace(attrs={"max": 6.0, "min": math.nan}) == a
    assert Node.make("Relu", ["x"], ["y"]) != Node.make("Relu", ["x"], ["z"])


@pytest.mark.parametrize("op,attrs", [
    ("Relu", {"alpha": 1.0}),  # unknown attribute
    ("Cast", {}),  # missing required attribute
    ("Transpose", {"perm": [0.5, 1]}),  # ints given floats
    ("Flatten", {"axis": True}),  # bool is not an int
    ("Flatten", {"axis": 1.5}),
    ("Gelu", {"approximate": 1}),
    ("Flatten", {"axis": float("inf")}),  # int() of it: an OverflowError
    ("Flatten", {"axis": 1 << 63}),  # past what an ONNX attribute's integer holds
    ("Transpose", {"perm": [0, 10 ** 5000]}),  # and its repr for the message: a ValueError
    ("LeakyRelu", {"alpha": 10 ** 400}),  # float() of it: an OverflowError
])
def test_node_make_rejects_bad_attributes(op, attrs):
    with pytest.raises(VerifyError) as caught:
        Node.make(op, ["x"], ["y"], **attrs)
    assert len(str(caught.value)) < 200


def test_64_bit_integer_attributes_are_taken():
    assert Node.make("Slice", ["x"], ["y"], starts=[0], ends=[(1 << 63) - 1], axes=[0], steps=[-1]).attr["ends"] == \
        ((1 << 63) - 1,)
    assert Node.make("Flatten", ["x"], ["y"], axis=2.0).attr["axis"] == 2


def test_node_make_rejects_unknown_op():
    with pytest.raises(VerifyError, match="unknown op"):
        Node.make("Frobnicate", ["x"], ["y"])


# --- graphs ---------------------------------------------------------------------------------------


def small_graph(**constants) -> Graph:
    consts = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), **constants}
    nodes = [Node.make("MatMul", ["x", "w"], ["h"]), Node.make("Relu", ["h"], ["y"])]
    return infer_graph_types("small", {"x": TensorType(F32, (N, 2))}, consts, nodes, ["y"])


def test_graph_equality_compares_constants_bitwise():
    g = small_graph()
    assert g == small_graph() and g is not small_graph()
    assert g != small_graph(w=np.arange(6, dtype=np.float32).reshape(3, 2).T.copy())  # same shape, other bytes
    assert g != g.replace(constants={"w": g.constants["w"].astype(np.float64)})  # same values, other dtype
    z = small_graph(z=np.array([0.0], np.float32))
    assert z != small_graph(z=np.array([-0.0], np.float32))  # == as numbers, not as bits
    nan = np.array([np.nan], np.float32)
    assert small_graph(z=nan) == small_graph(z=nan.copy())  # same bits: equal, though nan != nan
    assert g != g.replace(name="other") and g != g.replace(outputs=("h",))
    with pytest.raises(TypeError):
        hash(g)


def test_graph_constants_are_frozen_copies():
    w = np.ones((2, 3), np.float32)
    g = small_graph(w=w)
    w[0, 0] = 5
    assert g.constants["w"][0, 0] == 1 and not g.constants["w"].flags.writeable
    with pytest.raises(ValueError):
        g.constants["w"][0, 0] = 2
    with pytest.raises(TypeError):
        g.types["x"] = TensorType(F32, (1,))  # type: ignore[index]


def test_graph_constants_keep_rank0_and_native_byte_order():
    g = small_graph(s=np.array(2.5, np.float32), be=np.arange(3, dtype=">i4"))
    verify(g)
    assert g.constants["s"].shape == () and g.constants["be"].dtype == np.dtype("int32")
    assert g.constants["be"].tolist() == [0, 1, 2]


def test_graph_helpers():
    g = small_graph()
    assert g.producers()["h"].op == "MatMul" and [n.op for n in g.consumers()["h"]] == ["Relu"]
    assert g.weight_bytes == 24 and g.parameter_count == 6
    assert g.input_types == {"x": TensorType(F32, (N, 2))} and g.output_types == {"y": TensorType(F32, (N, 3))}


# --- the verifier ---------------------------------------------------------------------------------


def broken(change) -> Graph:
    """small_graph with one field edited, bypassing inference."""
    g = small_graph()
    return g.replace(**change(g))


RELU = Node("Relu", "r", ("x",), ("z",))
BROKEN = {
    "use before def": lambda g: {"nodes": g.nodes[::-1]},
    "undefined input": lambda g: {"nodes": (g.nodes[0].replace(inputs=("x", "nope")), g.nodes[1])},
    "duplicate value": lambda g: {"nodes": g.nodes + (RELU.replace(outputs=("h",)),)},
    "input shadows constant": lambda g: {"inputs": ("x", "w")},
    "duplicate node name": lambda g: {"nodes": g.nodes + (RELU.replace(name=g.nodes[0].name),),
                                      "types": {**g.types, "z": g.types["x"]}},
    "wrong output type": lambda g: {"types": {**g.types, "y": TensorType(F32, (N, 4))}},
    "wrong output dtype": lambda g: {"types": {**g.types, "h": TensorType(DType.F64, (N, 3))}},
    "concrete batch": lambda g: {"types": {**g.types, "y": TensorType(F32, (1, 3))}},
    "wrong constant type": lambda g: {"types": {**g.types, "w": TensorType(F32, (3, 2))}},
    "untyped value": lambda g: {"types": {k: v for k, v in g.types.items() if k != "h"}},
    "extra type": lambda g: {"types": {**g.types, "ghost": g.types["x"]}},
    "unknown op": lambda g: {"nodes": (g.nodes[0], g.nodes[1].replace(op="Frobnicate"))},
    "unknown attr": lambda g: {"nodes": (g.nodes[0], g.nodes[1].replace(attrs={"alpha": 1.0}))},
    "missing attr": lambda g: {"nodes": (g.nodes[0], g.nodes[1].replace(op="LeakyRelu"))},
    "missing required attr": lambda g: {"nodes": (g.nodes[0], g.nodes[1].replace(op="Cast"))},
    "attr of wrong kind": lambda g: {"nodes": (g.nodes[0], Node("LeakyRelu", "r", ("h",), ("y",), (("alpha", "1"),)))},
    "repeated attr": lambda g: {"nodes": (g.nodes[0], Node("LeakyRelu", "r", ("h",), ("y",), (("alpha", 1.0),) * 2))},
    "unsorted attrs": lambda g: {"nodes": (g.nodes[0], Node("HardSigmoid", "r", ("h",), ("y",), (("beta", 0.5), ("alpha", 0.2))))},
    "too few inputs": lambda g: {"nodes": (g.nodes[0].replace(inputs=("x",)), g.nodes[1])},
    "too many inputs": lambda g: {"nodes": (g.nodes[0], g.nodes[1].replace(inputs=("h", "h")))},
    "too many outputs": lambda g: {"nodes": (g.nodes[0], g.nodes[1].replace(outputs=("y", "y2"))),
                                   "types": {**g.types, "y2": g.types["y"]}},
    "shape error": lambda g: {"nodes": (g.nodes[0].replace(inputs=("w", "x")), g.nodes[1])},
    "output never defined": lambda g: {"outputs": ("y", "missing")},
    "no outputs": lambda g: {"outputs": ()},
    "empty name": lambda g: {"inputs": ("x", ""), "types": {**g.types, "": g.types["x"]}},
    "surrogate in a value name": lambda g: {"inputs": ("x", "\ud83d"), "types": {**g.types, "\ud83d": g.types["x"]}},
    "surrogate pair in a node name": lambda g: {"nodes": (g.nodes[0].replace(name="\ud83d\ude00"), g.nodes[1])},
    "surrogate in the graph name": lambda g: {"name": "g\udc80"},
    "bool byte of 2": lambda g: {"constants": {**g.constants, "m": np.array([0, 2], np.uint8).view(np.bool_)},
                                 "types": {**g.types, "m": TensorType(DType.BOOL, (2,))}},
}


def test_verifier_accepts_the_small_graph():
    assert verify(small_graph()) == small_graph()


@pytest.mark.parametrize("case", BROKEN)
def test_verifier_rejects(case):
    with pytest.raises(VerifyError):
        verify(broken(BROKEN[case]))


# --- the text form --------------------------------------------------------------------------------

ODD_NAMES = ["onnx::Add_3", "/layer1/conv", "N", "inf", "nan", "graph", "const", "data", "2N", "with space",
             'quo"te', "ünï", "inf.x", "nan-1", "a,b", "x->y", "-1", "1e5", "{}", "@"]


def rich_graph() -> Graph:
    """Every attribute kind, symbolic dims N and 2N, odd names, and constants of every dtype."""
    rng = np.random.default_rng(0)
    consts = {
        "onnx::Conv_12": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "conv.bias": np.array([0.0, -0.0, np.nan, np.inf], np.float32),
        "fc/weight": rng.standard_normal((10, 256)).astype(np.float32),
        "half": np.array([1.5, -65504.0], np.float16), "flags": np.array([[True, False]]), "bytes": np.arange(5, dtype=np.uint8),
        "i8": np.array([-128, 127], np.int8), "idx": np.array([2**40, -1], np.int64), "i32": np.array(7, np.int32),
        "f64": np.array([1e-300, math.pi]), "empty": np.zeros((0, 3), np.float32),
    }
    ins = {"x": TensorType(F32, (N, 3, 8, 8)), **{n: TensorType(F32, (N,)) for n in ODD_NAMES}}
    nodes = [
        Node.make("Conv", ["x", "onnx::Conv_12", "conv.bias"], ["/layer1/conv/Conv_output_0"], name="/layer1/conv",
                  strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1]),
        Node.make("Clip", ["/layer1/conv/Conv_output_0"], ["clipped"], min=-math.inf, max=6),
        Node.make("LeakyRelu", ["clipped"], ["leaky"], alpha=1e-05),
        Node.make("Flatten", ["leaky"], ["flat"], axis=1),
        Node.make("Concat", ["flat", "flat"], ["twice"], axis=0),
        Node.make("Gemm", ["twice", "fc/weight"], ["logits"], alpha=0.1, beta=1e300, transB=1),
        Node.make("Split", ["logits"], ["a", "b"], axis=-1, split=[3, 7]),
        Node.make("Cast", ["a"], ["a16"], to=DType.F16),
        Node.make("Gelu", ["b"], ["g"], approximate="tanh"),
        Node.make("HardSigmoid", ["inf"], ["hs"], alpha=-0.0, beta=5e-324),
        Node.make("Clip", ["nan"], ["nan-clip"], min=math.nan, max=math.inf),
        *[Node.make("Identity", [n], [f"id:{n}"], name=f"node {n}") for n in ODD_NAMES],
    ]
    outs = ["a16", "g", "hs", "nan-clip", *[f"id:{n}" for n in ODD_NAMES]]
    return verify(infer_graph_types("rich \"model\" ✓", ins, consts, nodes, outs))


def test_text_round_trips_exactly():
    g = rich_graph()
    text = print_graph(g)
    again = parse_graph(text)
    assert again == g and print_graph(again) == text
    assert verify(again) == g
    assert again.types["twice"].shape == (Batch(2), 256) and again.types["logits"].shape == (Batch(2), 10)
    for name in ["leaky", "hs", "nan-clip"]:
        assert again.producers()[name].attr == g.producers()[name].attr
    assert math.copysign(1, again.producers()["hs"].attr["alpha"]) == -1


def test_text_shows_what_a_reader_needs():
    text = print_graph(rich_graph())
    for piece in ['"onnx::Conv_12"', "@/layer1/conv (x,", "alpha=1e-05", "min=-inf", "min=nan", "f32[2N,256]",
                  "x: f32[N,3,8,8]", '"N": f32[N]', 'approximate="tanh"', "to=f16", "split=[3,7]", "data conv.bias"]:
        assert piece in text, piece


def test_text_without_data_takes_constants_from_elsewhere():
    g = rich_graph()
    text = print_graph(g, data=False)
    assert "\ndata " not in text
    assert parse_graph(text, constants=dict(g.constants)) == g
    with pytest.raises(ParseError, match="no data"):
        parse_graph(text)


def test_float_list_attributes_round_trip():
    """No op in v1 has a floats attribute yet; the printer and parser support it for one that will."""
    values = (1e-05, -math.inf, math.inf, -0.0, 0.1, 1e300)
    toks = _Tokens(_attr(AttrKind.FLOATS, values))
    assert toks.attr_value(AttrKind.FLOATS) == values
    parsed = _Tokens(_attr(AttrKind.FLOATS, (math.nan,))).attr_value(AttrKind.FLOATS)
    assert math.isnan(parsed[0])


def test_float32_values_print_short_and_read_back_bit_exactly():
    """Per-channel scales are float32: their shortest float32 form, marked f, not 17 double digits."""
    scale = float(np.float32(0.0024301619))
    assert _attr(AttrKind.FLOATS, (scale, 0.5, 0.1)) == "[0.002430162f,0.5,0.1]"
    assert _Tokens("0.002430162f").attr_value(AttrKind.FLOAT) == scale == 0.00243016192689538
    assert _Tokens("0.002430162").attr_value(AttrKind.FLOAT) == 0.002430162 != scale
    assert _attr(AttrKind.FLOAT, float(np.float32(0.1))) == "0.1f"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=8))
def test_any_float32_list_round_trips_bit_exactly(values):
    values = tuple(values)
    text = _attr(AttrKind.FLOATS, values)
    back = _Tokens(text).attr_value(AttrKind.FLOATS)
    assert np.array_equal(np.array(back).view(np.uint64), np.array(values).view(np.uint64))
    assert all(len(v) <= 16 for v in text.strip("[]").split(","))


@pytest.mark.parametrize("text", ["Flatten @y (x) {axis=1f}", "Flatten @y (x) {axis=-1f}"])
def test_float32_mark_is_not_an_integer(text):
    with pytest.raises(ParseError):
        parse_graph(HEAD + f"  y: f32[N,3] = {text}\n}}")
    with pytest.raises(ParseError):
        parse_graph('graph "g" (x: f32[3f]) -> (x) {}')


@settings(max_examples=150, deadline=None)
@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12), st.floats(), st.integers(1, 9))
def test_any_name_and_float_round_trip(a, b, alpha, factor):
    ins = {a: TensorType(F32, (Batch(factor), 2))}
    nodes = [Node.make("LeakyRelu", [a], [a + "'"], name=b, alpha=alpha)]
    g = verify(infer_graph_types(b, ins, {b + "w": np.array([alpha])}, nodes, [a + "'"]))
    assert parse_graph(print_graph(g)) == g


@pytest.mark.parametrize("name", ["A\n", "x\n", "graph\n"])
def test_a_name_ending_in_a_newline_is_quoted(name):
    """A bare name's pattern once matched before a trailing newline, which the reader then lost."""
    ins = {"x": TensorType(F32, (Batch(1), 2))}
    g = verify(infer_graph_types("g", ins, {}, [Node.make("Relu", ["x"], ["y"], name=name)], ["y"]))
    assert json.dumps(name) in print_graph(g)
    assert parse_graph(print_graph(g)).nodes[0].name == name


def test_a_node_named_empty_keeps_its_name():
    """The reader made nodes with Node.make, which names a nameless node after its first output: "" read back
    as "y" (not canonical), here the name of another node."""
    ty = TensorType(F32, (N, 2))
    g = verify(Graph("g", ("x",), ("z",), (Node("Relu", "", ("x",), ("y",)), Node("Relu", "y", ("y",), ("z",))),
                     {"x": ty, "y": ty, "z": ty}))
    again = parse_graph(print_graph(g))
    assert again == g and verify(again) == g


def test_attribute_values_print_as_the_reader_makes_them():
    """Values of another type than their kind (which verify refuses) print as the reader rebuilds them: they
    made "alpha=np.float64(0.1)" and "transB=1.0", which do not parse."""
    node = Node.make("Gemm", ["x", "w"], ["y"], transB=1)
    g = infer_graph_types("g", {"x": TensorType(F32, (N, 3))}, {"w": np.ones((4, 3), np.float32)}, [node], ["y"])
    odd = g.replace(nodes=(node.replace(attrs={**node.attr, "alpha": np.float64(0.1), "transB": 1.0}),))
    with pytest.raises(VerifyError, match="canonical"):
        verify(odd)
    text = print_graph(odd)
    assert "alpha=0.1," in text and "transB=1}" in text
    again = verify(parse_graph(text))
    assert again.nodes[0].attr["alpha"] == 0.1 and type(again.nodes[0].attr["transB"]) is int
    assert print_graph(again) == text


@pytest.mark.parametrize("axis", [1.0, np.int64(1)])
def test_an_attribute_of_another_type_than_its_kind_is_not_canonical(axis):
    """Equal in value is not enough: Flatten's axis=1.0 passed the check, then shape inference raised TypeError."""
    node = Node.make("Flatten", ["x"], ["y"], axis=1)
    g = infer_graph_types("g", {"x": TensorType(F32, (N, 2, 3))}, {}, [node], ["y"])
    with pytest.raises(VerifyError, match="canonical"):
        verify(g.replace(nodes=(node.replace(attrs={"axis": axis}),)))


def test_a_float32_literal_past_its_range_reads_as_inf_without_a_warning():
    """The cast to float32 overflowed with a NumPy RuntimeWarning: an exception under -W error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        node = parse_graph(HEAD + "  y: f32[N,3] = LeakyRelu @y (x) {alpha=-1e39f}\n}").nodes[0]
    assert node.attr["alpha"] == -math.inf


def test_an_integer_past_pythons_digit_limit_is_a_parse_error():
    """int() refuses more than 4,300 digits with a ValueError, which the loader's parse_type let through."""
    with pytest.raises(ParseError, match="5000 characters"):
        parse_type("f32[" + "9" * 5000 + "]")


HEAD = 'graph "g" (x: f32[N,3]) -> (y) {\n'
PARSE_ERRORS = {
    "empty": "",
    "not a graph": "grahp \"g\" () -> () {}",
    "unterminated": HEAD + "  y: f32[N,3] = Relu @y (x)\n",
    "trailing garbage": HEAD + "  y: f32[N,3] = Relu @y (x)\n}\n}",
    "stray character": HEAD + "  y: f32[N,3] = Relu @y (x) ;\n}",
    "unknown dtype": 'graph "g" (x: q8[3]) -> (x) {}',
    "negative dim": 'graph "g" (x: f32[-3]) -> (x) {}',
    "zero batch factor": 'graph "g" (x: f32[0N]) -> (x) {}',
    "float dim": 'graph "g" (x: f32[1.5]) -> (x) {}',
    "unknown op": HEAD + "  y: f32[N,3] = Frobnicate @y (x)\n}",
    "unknown attr": HEAD + "  y: f32[N,3] = Relu @y (x) {alpha=1.0}\n}",
    "repeated attr": HEAD + "  y: f32[N,3] = LeakyRelu @y (x) {alpha=1.0, alpha=2.0}\n}",
    "missing attr": HEAD + "  y: f32[N,3] = Cast @y (x)\n}",
    "float for int": HEAD + "  y: f32[N,3] = Flatten @y (x) {axis=1.0}\n}",
    "name for float": HEAD + "  y: f32[N,3] = LeakyRelu @y (x) {alpha=big}\n}",
    "number for string": HEAD + "  y: f32[N,3] = Gelu @y (x) {approximate=1}\n}",
    "unknown dtype attr": HEAD + "  y: f32[N,3] = Cast @y (x) {to=f99}\n}",
    "bad escape": 'graph "\\q" (x: f32[3]) -> (x) {}',
    "missing data": 'graph "g" () -> (c) {\n  const c: f32[2]\n}',
    "bad base64": 'graph "g" () -> (c) {\n  const c: f32[1]\n}\ndata c "!!!!"',
    "short data": 'graph "g" () -> (c) {\n  const c: f32[2]\n}\ndata c "AAAAAA=="',
    "data for an input": 'graph "g" (x: f32[1]) -> (x) {\n}\ndata x "AAAAAA=="',
    "data twice": 'graph "g" () -> (c) {\n  const c: f32[1]\n}\ndata c "AAAAAA=="\ndata c "AAAAAA=="',
    "symbolic constant": 'graph "g" () -> (c) {\n  const c: f32[N]\n}\ndata c "AAAAAA=="',
    "bounded constant": 'graph "g" () -> (c) {\n  const c: i64[<=3]\n}\ndata c "' + "A" * 43 + '="',  # 24 bytes + count
    "empty constant NumPy cannot shape": 'graph "g" () -> (c) {\n  const c: f32[0,281474976710656,65536]\n}\ndata c ""',
    "huge dimension": 'graph "g" (x: f32[' + "9" * 5000 + ']) -> (x) {}',
    "huge batch factor": 'graph "g" (x: f32[' + "9" * 5000 + 'N]) -> (x) {}',
    "huge int attr": HEAD + "  y: f32[N,3] = Flatten @y (x) {axis=-" + "9" * 5000 + "}\n}",
}


@pytest.mark.parametrize("case", PARSE_ERRORS)
def test_bad_text_raises_parse_error(case):
    with pytest.raises(ParseError):
        parse_graph(PARSE_ERRORS[case])


def test_parse_error_names_the_line():
    with pytest.raises(ParseError, match="line 3"):
        parse_graph(HEAD + "  h: f32[N,3] = Relu @h (x)\n  y: f32[N,3] = Relu @y (h) ?\n}")
