"""The op table's traits: consistent with each other, with the ONNX schemas they claim, and enforced."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType
from cuvil.compiler.errors import ShapeError
from cuvil.compiler.ops import OP_TABLE, REQUIRED, OpDef, get_op

I32 = TensorType(DType.I32, (2, 3))
F32 = TensorType(DType.F32, (2, 3))


def test_traits_agree_with_each_other():
    for name, op in OP_TABLE.items():
        assert not op.fusable or op.elementwise, name  # a FusedElementwise step computes element i from element i
        assert not op.view or op.max_inputs == 1, name  # a view re-labels its one input
        assert not (op.elementwise and op.inplace), name  # elementwise already lets every input share


@pytest.mark.parametrize("name", sorted(n for n, op in OP_TABLE.items() if op.same_as_onnx))
def test_same_as_onnx_matches_the_onnx_schema(name):
    """Inputs, attribute names, required attributes and defaults as ONNX defines them (opset 21)."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    op, schema = OP_TABLE[name], onnx.defs.get_schema(name, 21)
    assert (op.min_inputs, op.max_inputs) == (schema.min_input, None if schema.max_input > 1000 else schema.max_input)
    assert set(op.attrs) <= set(schema.attributes), name
    for key, spec in op.attrs.items():
        theirs = schema.attributes[key]
        assert (spec.default is REQUIRED) == theirs.required, key
        if spec.default is not REQUIRED:
            value = helper.get_attribute_value(theirs.default_value)
            value = value.decode() if isinstance(value, bytes) else value
            assert value == (np.float32(spec.default) if isinstance(value, float) else spec.default), key


def test_float_only_is_checked_before_the_shape_rule():
    calls = []
    op = OpDef("T", lambda ts, a: calls.append(ts) or [ts[0]], lambda xs, a: xs, float_only=True)
    with pytest.raises(ShapeError, match="T: needs a float operand, got i32"):
        op.infer([I32], {})
    assert calls == [] and op.infer([F32], {}) == [F32]
    with pytest.raises(ShapeError, match="needs a float operand"):
        get_op("Sigmoid").infer([I32], {})
    assert get_op("Relu").infer([I32], {}) == [I32]


def test_in_place_rules():
    fused = get_op("FusedConv").normalize_attrs({"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1),
                                                 "has_bias": 1, "has_residual": 1})
    assert [get_op("FusedConv").shares(fused, i) for i in range(4)] == [False, False, False, True]
    assert [get_op("Reshape").shares({}, i) for i in range(2)] == [True, False]
    assert [get_op("Where").shares({}, i) for i in range(3)] == [True, True, True]
    assert [get_op("BatchNormalization").shares({}, i) for i in range(5)] == [True] + [False] * 4
    for name in ("Softmax", "LogSoftmax", "LayerNormalization", "Conv", "Transpose", "Concat", "MaxPool"):
        assert not any(get_op(name).shares({}, i) for i in range(3)), name


def test_flop_rules():
    conv = get_op("FusedConv")
    attrs = {"has_bias": 1, "has_residual": 1, "activation": "Relu"}
    x, w, y = TensorType(DType.F32, (1, 3, 8, 8)), TensorType(DType.F32, (16, 3, 3, 3)), TensorType(DType.F32, (1, 16, 8, 8))
    assert conv.flops(attrs, [x, w], [y]) == 2 * 16 * 64 * 27 + 3 * 16 * 64
    assert get_op("Sigmoid").flops({}, [F32], [F32]) == 6
    assert get_op("Softmax").flops({}, [F32], [F32]) == 18
    assert get_op("Transpose").flops({}, [F32], [F32]) == 0
