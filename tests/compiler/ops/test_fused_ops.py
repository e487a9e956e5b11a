"""The fused ops: references equal the composition of the ops they replace; malformed nodes rejected."""

import numpy as np
import pytest

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types, parse_graph, print_graph, run_reference
from cuvil.compiler.errors import CuvilError, ShapeError
from cuvil.compiler.ops import get_op
from cuvil.compiler.ops.fused import ACTIVATIONS, Step, activation_of, format_program, parse_program

CONV = dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)


def f32(*shape):
    return TensorType(DType.F32, shape)


def ref(op, xs, **attrs):
    opdef = get_op(op)
    return opdef.reference(xs, opdef.normalize_attrs(attrs))[0]


@pytest.mark.parametrize("bias,residual,act", [(1, 1, "Relu"), (0, 1, "none"), (1, 0, "Clip"), (0, 0, "GeluTanh")])
def test_fused_conv_is_conv_then_residual_then_activation(rng, bias, residual, act):
    x, w = rng.standard_normal((1, 3, 5, 5), dtype=np.float32), rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    b, r = rng.standard_normal(4, dtype=np.float32), rng.standard_normal((1, 4, 5, 5), dtype=np.float32)
    alpha, beta = (-1.0, 1.0) if act == "Clip" else (0.0, 0.0)
    got = ref("FusedConv", [x, w] + [b] * bias + [r] * residual, **CONV, has_bias=bias, has_residual=residual,
              activation=act, act_alpha=alpha, act_beta=beta)
    want = ref("Conv", [x, w] + [b] * bias, **CONV)
    if residual:
        want = want + r
    if act != "none":
        spec = ACTIVATIONS[act]
        want = ref(spec.op, [want], **spec.op_attrs(alpha, beta))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_activation_table_round_trips_through_node_attributes():
    for name, spec in ACTIVATIONS.items():
        attrs = get_op(spec.op).normalize_attrs(spec.op_attrs(0.25, 0.75))
        found = activation_of(spec.op, attrs)
        assert found is not None and found[0] == name
    assert activation_of("Exp", {}) is None


BAD = [
    ("FusedConv", [f32(1, 3, 5, 5), f32(4, 3, 3, 3)], dict(CONV, activation="Swish"), "unknown activation"),
    ("FusedConv", [f32(1, 3, 5, 5), f32(4, 3, 3, 3)], dict(CONV, has_bias=1), "need 3 inputs"),
    ("FusedConv", [f32(1, 3, 5, 5), f32(4, 3, 3, 3), f32(1, 4, 4, 4)], dict(CONV, has_residual=1), "residual"),
    ("FusedGemm", [f32(2, 3), f32(3, 4)], dict(has_bias=2), "0 or 1"),
    ("FusedElementwise", [f32(3)], dict(program="Relu(1)"), "not yet written"),
    ("FusedElementwise", [f32(3), f32(3)], dict(program="Relu(0)"), "never read"),
    ("FusedElementwise", [f32(3)], dict(program="Conv(0)"), "not a fusable"),
    ("FusedElementwise", [f32(3)], dict(program="Relu 0"), "is not Op"),
    ("FusedElementwise", [f32(3)], dict(program="Clip{max=6.0}(0)"), "not canonical"),
    ("FusedElementwise", [f32(3)], dict(program="Clip{top=6.0}(0)"), "no attribute"),
    ("FusedElementwise", [f32(3)], dict(program=""), "empty program"),
    ("FusedElementwise", [f32(3)], dict(program="LeakyRelu{alpha=x}(0)"), "is not a float"),
]


@pytest.mark.parametrize("op,types,attrs,message", BAD, ids=[b[3] for b in BAD])
def test_malformed_fused_nodes_are_rejected(op, types, attrs, message):
    inputs = {f"x{i}": t for i, t in enumerate(types)}
    with pytest.raises(CuvilError, match=message):
        infer_graph_types("g", inputs, {}, [Node.make(op, list(inputs), ["y"], **attrs)], ["y"])


def test_fused_elementwise_runs_its_program_and_round_trips_as_text(rng):
    program = "Mul(0,1);Add(3,2);Clip{max=6.0,min=0.0}(4)"
    assert format_program(parse_program(program)) == program
    g = infer_graph_types("g", {"x": f32(N, 4), "s": f32(4), "b": f32(1, 4)}, {},
                          [Node.make("FusedElementwise", ["x", "s", "b"], ["y"], program=program)], ["y"])
    assert g.types["y"] == f32(N, 4)
    assert parse_graph(print_graph(g)) == g
    x, s, b = (rng.standard_normal(shape, dtype=np.float32) for shape in ((3, 4), (4,), (1, 4)))
    np.testing.assert_allclose(run_reference(g, {"x": x, "s": s, "b": b})["y"], np.clip(x * s + b, 0, 6), rtol=1e-6)


@pytest.mark.parametrize("word", ["tanh\n", "tan h", ""])
def test_a_string_attribute_that_is_not_one_bare_word_is_refused(word):
    with pytest.raises(ShapeError, match="not a bare word"):
        format_program([Step("Gelu", (0,), (("approximate", word),))])
