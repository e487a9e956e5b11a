"""Every op of compiler/ops/shape.py against ONNX Runtime, plus the operands each one rejects.

ONNX passes shapes, starts, axes, pads and split sizes as constant inputs; Cuvil holds them as
attributes. Each case names both forms, so the check also pins down that translation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from cuvil.compiler import N, Batch, DType, Node, TensorType, infer_graph_types, run_reference, verify
from cuvil.compiler.errors import ShapeError
from cuvil.compiler.ops import OP_TABLE, shape

from .ort_check import Const, assert_close, run_cuvil, run_ort

I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
# interpreter.bind_inputs passes inputs through np.ascontiguousarray, which turns 0-d arrays into
# shape (1,); these cases pass once it keeps 0-d inputs 0-d (np.asarray(arr, order="C")).


def i64(*v) -> Const:
    return Const(np.array(v, dtype=np.int64))


@dataclass(frozen=True)
class Case:
    """One check: the Cuvil op and attrs, and the ONNX op's constant inputs and attributes."""

    op: str
    shapes: tuple  # input shapes (data operands only)
    attrs: dict = field(default_factory=dict)
    onnx_consts: tuple = ()  # ONNX constant inputs after the data operands (None: omitted)
    onnx_attrs: dict = field(default_factory=dict)
    opset: int = 17
    dtype: type = np.float32

    def __str__(self) -> str:
        return f"{self.op}{list(self.shapes)}{self.attrs}"


CASES = [
    # Reshape: 0 copies, -1 infers
    Case("Reshape", ((2, 3, 4),), {"shape": [6, 4]}, (i64(6, 4),)),
    Case("Reshape", ((2, 3, 4),), {"shape": [0, -1]}, (i64(0, -1),)),
    Case("Reshape", ((2, 3, 4),), {"shape": [-1]}, (i64(-1),)),
    Case("Reshape", ((2, 3, 4),), {"shape": [0, 0, 2, 2]}, (i64(0, 0, 2, 2),)),
    Case("Reshape", ((2, 3, 4),), {"shape": [4, 0, -1]}, (i64(4, 0, -1),)),
    Case("Reshape", ((1,),), {"shape": []}, (i64(),)),
    Case("Reshape", ((0, 4),), {"shape": [0, 2, 2]}, (i64(0, 2, 2),)),
    # Flatten
    *[Case("Flatten", ((2, 3, 4, 5),), {"axis": a}, (), {"axis": a}) for a in (0, 1, 2, 4, -1, -4)],
    # Transpose
    Case("Transpose", ((2, 3, 4),), {"perm": [2, 0, 1]}, (), {"perm": [2, 0, 1]}),
    Case("Transpose", ((2, 3),), {"perm": [0, 1]}, (), {"perm": [0, 1]}),
    Case("Transpose", ((2, 3, 4, 5),), {"perm": [0, 2, 3, 1]}, (), {"perm": [0, 2, 3, 1]}, dtype=np.int64),
    # Concat
    Case("Concat", ((2, 3), (4, 3), (1, 3)), {"axis": 0}, (), {"axis": 0}),
    Case("Concat", ((2, 3, 1), (2, 3, 5)), {"axis": -1}, (), {"axis": -1}),
    Case("Concat", ((2, 0), (2, 4)), {"axis": 1}, (), {"axis": 1}),
    Case("Concat", ((3,),), {"axis": 0}, (), {"axis": 0}, dtype=np.int32),
    # Split
    Case("Split", ((6, 4),), {"split": [2, 4]}, (i64(2, 4),), {"axis": 0}),
    Case("Split", ((2, 7),), {"axis": -1, "split": [1, 3, 3]}, (i64(1, 3, 3),), {"axis": -1}),
    Case("Split", ((2, 5),), {"axis": 1, "split": [5]}, (i64(5),), {"axis": 1}),
    # Slice: clamping, negative indices, negative steps, INT64 sentinels
    Case("Slice", ((5, 6),), dict(starts=[1], ends=[4], axes=[0], steps=[1]), (i64(1), i64(4), i64(0), i64(1))),
    Case("Slice", ((5, 6),), dict(starts=[-4, 1], ends=[-1, 100], axes=[1, 0], steps=[1, 2]),
         (i64(-4, 1), i64(-1, 100), i64(1, 0), i64(1, 2))),
    Case("Slice", ((5, 6),), dict(starts=[-100], ends=[100], axes=[-1], steps=[3]), (i64(-100), i64(100), i64(-1), i64(3))),
    Case("Slice", ((5, 6),), dict(starts=[4], ends=[1], axes=[0], steps=[1]), (i64(4), i64(1), i64(0), i64(1))),
    Case("Slice", ((5, 6),), dict(starts=[-1], ends=[I64_MIN], axes=[1], steps=[-1]), (i64(-1), i64(I64_MIN), i64(1), i64(-1))),
    Case("Slice", ((5, 6),), dict(starts=[I64_MAX], ends=[I64_MIN], axes=[0], steps=[-2]),
         (i64(I64_MAX), i64(I64_MIN), i64(0), i64(-2))),
    Case("Slice", ((5, 6),), dict(starts=[100], ends=[-100], axes=[1], steps=[-1]), (i64(100), i64(-100), i64(1), i64(-1))),
    Case("Slice", ((5, 6),), dict(starts=[4], ends=[0], axes=[1], steps=[-3]), (i64(4), i64(0), i64(1), i64(-3))),
    Case("Slice", ((5, 6),), dict(starts=[0], ends=[I64_MAX], axes=[0], steps=[1]), (i64(0), i64(I64_MAX), i64(0), i64(1))),
    Case("Slice", ((5, 6),), dict(starts=[-7], ends=[-6], axes=[0], steps=[-1]), (i64(-7), i64(-6), i64(0), i64(-1))),
    Case("Slice", ((2, 3, 4),), dict(starts=[1, 0], ends=[2, -1], axes=[0, 2], steps=[1, 1]),
         (i64(1, 0), i64(2, -1), i64(0, 2), i64(1, 1))),
    # Squeeze / Unsqueeze (negative Unsqueeze axes count from the output's rank)
    Case("Squeeze", ((1, 3, 1, 2),), {"axes": [0, 2]}, (i64(0, 2),), opset=13),
    Case("Squeeze", ((1, 3, 1, 2),), {"axes": [-2]}, (i64(-2),), opset=13),
    Case("Unsqueeze", ((3, 2),), {"axes": [0, 3]}, (i64(0, 3),), opset=13),
    Case("Unsqueeze", ((3, 2),), {"axes": [-1]}, (i64(-1),), opset=13),
    Case("Unsqueeze", ((3, 2),), {"axes": [1, -1]}, (i64(1, -1),), opset=13),
    Case("Unsqueeze", ((),), {"axes": [0]}, (i64(0),), opset=13),
    # Pad: begins then ends; constant (with value, negative pads crop), reflect, edge
    Case("Pad", ((2, 3),), {"pads": [1, 2, 0, 1]}, (i64(1, 2, 0, 1),)),
    Case("Pad", ((2, 3),), {"pads": [0, 1, 2, 0], "value": -1.5}, (i64(0, 1, 2, 0), Const(np.float32(-1.5)))),
    Case("Pad", ((3, 4),), {"pads": [-1, 1, 0, -2]}, (i64(-1, 1, 0, -2),)),
    Case("Pad", ((3, 4),), {"pads": [2, 3, 1, 2], "mode": "reflect"}, (i64(2, 3, 1, 2),), {"mode": "reflect"}),
    Case("Pad", ((1, 2, 3, 4),), {"pads": [0, 0, 1, 1, 0, 0, 2, 3], "mode": "reflect"},
         (i64(0, 0, 1, 1, 0, 0, 2, 3),), {"mode": "reflect"}),
    Case("Pad", ((3, 4),), {"pads": [2, 5, 4, 1], "mode": "edge"}, (i64(2, 5, 4, 1),), {"mode": "edge"}),
    Case("Pad", ((3, 4),), {"pads": [1, 1, 1, 1], "value": 7.0}, (i64(1, 1, 1, 1), Const(np.int64(7))), dtype=np.int64),
    # Expand: bidirectional broadcast
    Case("Expand", ((3, 1),), {"shape": [2, 3, 4]}, (i64(2, 3, 4),)),
    Case("Expand", ((2, 3, 4),), {"shape": [3, 1]}, (i64(3, 1),)),
    Case("Expand", ((1, 4),), {"shape": [1]}, (i64(1),)),
    Case("Expand", ((),), {"shape": [2, 2]}, (i64(2, 2),), dtype=np.int32),
    # Shape
    Case("Shape", ((2, 3, 4),)),
    Case("Shape", ((),)),
]


def data(rng, shape, dtype) -> np.ndarray:
    return (rng.standard_normal(shape) * 10).astype(dtype)


def n_outputs(case: Case) -> int:
    return len(case.attrs["split"]) if case.op == "Split" else 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c))
def test_shape_op_matches_onnxruntime(rng, case):
    xs = [data(rng, s, case.dtype) for s in case.shapes]
    n = n_outputs(case)
    expected = run_ort(case.op, [*xs, *case.onnx_consts], case.onnx_attrs, n_outputs=n, opset=case.opset)
    assert_close(run_cuvil(case.op, xs, n_outputs=n, **case.attrs), expected, rtol=0, atol=0)


GATHERS = [
    ((5, 3), [0, -1, 2, -5], 0),
    ((5, 3), [[0, 1], [-1, -2], [4, 0]], 0),
    ((2, 3, 4), [[-1, 0], [2, 1]], 1),
    ((2, 3, 4), [3, -4], -1),
    ((4,), 2, 0),
    ((2, 3), [[[1]]], -2),
]


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("shape,indices,axis", GATHERS, ids=str)
def test_gather_matches_onnxruntime(rng, shape, indices, axis, index_dtype):
    x, idx = data(rng, shape, np.float32), np.array(indices, dtype=index_dtype)
    got = run_cuvil("Gather", [x, idx], axis=axis)
    assert got[0].ndim == x.ndim - 1 + idx.ndim
    assert_close(got, run_ort("Gather", [x, idx], {"axis": axis}), rtol=0, atol=0)


def test_results_are_fresh_arrays(rng):
    """The interpreter must never hand out views of its inputs (identity transposes included)."""
    x = data(rng, (2, 3), np.float32)
    for op, attrs in [("Transpose", {"perm": [0, 1]}), ("Reshape", {"shape": [0, 0]}), ("Expand", {"shape": [2, 3]}),
                      ("Slice", dict(starts=[0], ends=[9], axes=[0], steps=[1])), ("Flatten", {"axis": 1})]:
        got, = run_cuvil(op, [x], **attrs)
        assert not np.shares_memory(got, x), op
        assert got.flags.c_contiguous, op


# --- rejected operands ----------------------------------------------------------------------------

F = DType.F32
BAD = [
    ("Reshape", [(2, 3)], {"shape": [4, 2]}),
    ("Reshape", [(2, 3)], {"shape": [-1, -1]}),
    ("Reshape", [(2, 3)], {"shape": [-1, 4]}),
    ("Reshape", [(2, 3)], {"shape": [-2, 3]}),
    ("Reshape", [(6,)], {"shape": [0, 6]}),
    ("Reshape", [(0, 3)], {"shape": [0, -1]}),
    ("Flatten", [(2, 3)], {"axis": 3}),
    ("Flatten", [(2, 3)], {"axis": -3}),
    ("Transpose", [(2, 3)], {"perm": [0, 0]}),
    ("Transpose", [(2, 3)], {"perm": [0, 1, 2]}),
    ("Concat", [(2, 3), (2, 4)], {"axis": 0}),
    ("Concat", [(2, 3), (2, 3, 1)], {"axis": 0}),
    ("Concat", [(2,), (2,)], {"axis": 1}),
    ("Concat", [(), ()], {"axis": 0}),
    ("Split", [(6,)], {"split": [2, 3]}),
    ("Split", [(6,)], {"split": [7, -1]}),
    ("Split", [(6,)], {"split": [6], "axis": 1}),
    ("Slice", [(4,)], dict(starts=[0], ends=[2], axes=[0], steps=[0])),
    ("Slice", [(4,)], dict(starts=[0, 1], ends=[2], axes=[0], steps=[1])),
    ("Slice", [(4,)], dict(starts=[0], ends=[2], axes=[1], steps=[1])),
    ("Slice", [(4, 4)], dict(starts=[0, 0], ends=[2, 2], axes=[0, -2], steps=[1, 1])),
    ("Squeeze", [(1, 3)], {"axes": [1]}),
    ("Squeeze", [(1, 3)], {"axes": [2]}),
    ("Squeeze", [(1, 1)], {"axes": [0, -2]}),
    ("Squeeze", [(1, 3)], {"axes": []}),
    ("Unsqueeze", [(2, 3)], {"axes": [3]}),
    ("Unsqueeze", [(2, 3)], {"axes": [-4]}),
    ("Unsqueeze", [(2, 3)], {"axes": [0, 0]}),
    ("Pad", [(2, 3)], {"pads": [1, 1]}),
    ("Pad", [(2, 3)], {"pads": [0, 0, 0, 0], "mode": "wrap"}),
    ("Pad", [(2, 3)], {"pads": [-2, 0, -1, 0]}),
    ("Pad", [(2, 3)], {"pads": [0, 3, 0, 0], "mode": "reflect"}),
    ("Pad", [(2, 3)], {"pads": [0, -1, 0, 0], "mode": "edge"}),
    ("Pad", [(0, 3)], {"pads": [1, 0, 0, 0], "mode": "edge"}),
    ("Expand", [(2, 3)], {"shape": [4, 3]}),
    ("Expand", [(3,)], {"shape": [-1]}),
]


@pytest.mark.parametrize("op,shapes,attrs", BAD, ids=[f"{b[0]}{b[2]}" for b in BAD])
def test_bad_operands_raise_shape_error(op, shapes, attrs):
    types = {f"x{i}": TensorType(F, s) for i, s in enumerate(shapes)}
    node = Node.make(op, list(types), ["y"], **attrs)
    with pytest.raises(ShapeError, match=op):
        infer_graph_types("bad", types, {}, [node], ["y"])


@pytest.mark.parametrize("types,attrs", [
    ([TensorType(F, (3,)), TensorType(F, (2,))], {}),
    ([TensorType(F, (3,)), TensorType(DType.I8, (2,))], {}),
    ([TensorType(F, ()), TensorType(DType.I64, (2,))], {}),
    ([TensorType(F, (3,)), TensorType(DType.I64, (2,))], {"axis": 1}),
])
def test_gather_rejects_bad_operands(types, attrs):
    with pytest.raises(ShapeError, match="Gather"):
        infer_graph_types("bad", {"x": types[0], "i": types[1]}, {}, [Node.make("Gather", ["x", "i"], ["y"], **attrs)], ["y"])


def test_gather_rejects_out_of_range_indices_when_run():
    with pytest.raises(ShapeError, match="out of range"):
        run_cuvil("Gather", [np.zeros((3, 2), np.float32), np.array([3], np.int64)])


def test_concat_rejects_mixed_dtypes():
    types = {"a": TensorType(F, (2,)), "b": TensorType(DType.F64, (2,))}
    with pytest.raises(ShapeError, match="Concat"):
        infer_graph_types("bad", types, {}, [Node.make("Concat", ["a", "b"], ["y"], axis=0)], ["y"])


# --- the batch symbol -----------------------------------------------------------------------------


def test_reshape_and_transpose_keep_the_symbolic_batch(rng):
    x_type = TensorType(F, (N, 4, 16))
    nodes = [Node.make("Reshape", ["x"], ["r"], shape=[-1, 64]), Node.make("Transpose", ["r"], ["t"], perm=[1, 0])]
    graph = verify(infer_graph_types("g", {"x": x_type}, {}, nodes, ["t"]))
    assert graph.types["r"] == TensorType(F, (N, 64))
    assert graph.types["t"] == TensorType(F, (64, N))
    for batch in (1, 3):
        x = data(rng, (batch, 4, 16), np.float32)
        np.testing.assert_array_equal(run_reference(graph, {"x": x})["t"], x.reshape(batch, 64).T)


SYMBOLIC = [
    ("Reshape", (N, 4, 16), {"shape": [0, 8, 8]}, (N, 8, 8)),
    ("Reshape", (N, 4, 16), {"shape": [-1, 16]}, (Batch(4), 16)),
    ("Reshape", (N, 4, 16), {"shape": [2, -1, 16]}, (2, Batch(2), 16)),
    ("Reshape", (N, 4, 16), {"shape": [3, -1]}, None),
    ("Reshape", (N, 4, 16), {"shape": [1, 4, 1024]}, None),
    ("Flatten", (N, 4, 16), {"axis": 1}, (N, 64)),
    ("Flatten", (N, 4, 16), {"axis": 0}, (1, Batch(64))),
    ("Squeeze", (N, 1, 16), {"axes": [1]}, (N, 16)),
    ("Unsqueeze", (N, 16), {"axes": [-1]}, (N, 16, 1)),
    ("Slice", (N, 16), dict(starts=[0, 2], ends=[I64_MAX, -2], axes=[0, 1], steps=[1, 1]), (N, 12)),
    ("Slice", (N, 16), dict(starts=[-1], ends=[I64_MIN], axes=[0], steps=[-1]), (N, 16)),
    ("Slice", (N, 16), dict(starts=[0], ends=[1], axes=[0], steps=[1]), (1, 16)),
    ("Pad", (N, 3), {"pads": [0, 1, 0, 1]}, (N, 5)),
    ("Expand", (N, 1, 4), {"shape": [3, 4]}, (N, 3, 4)),
    ("Split", (N, 6), {"axis": 1, "split": [2, 4]}, (N, 2)),
    ("Shape", (N, 6), {}, (2,)),
]


@pytest.mark.parametrize("op,in_shape,attrs,out_shape", SYMBOLIC, ids=[f"{s[0]}{s[2]}" for s in SYMBOLIC])
def test_symbolic_batch_flows_through_shape_rules(op, in_shape, attrs, out_shape):
    n_out = len(attrs["split"]) if op == "Split" else 1
    node = Node.make(op, ["x"], [f"y{i}" for i in range(n_out)], **attrs)
    build = lambda: infer_graph_types("g", {"x": TensorType(F, in_shape)}, {}, [node], list(node.outputs))  # noqa: E731
    if out_shape is None:
        with pytest.raises(ShapeError):
            build()
        return
    graph = verify(build())
    assert graph.types["y0"].shape == out_shape


def test_every_shape_op_is_tested_here():
    source = open(shape.__file__).read()
    ops = {name for name in OP_TABLE if f'OpDef("{name}"' in source}
    # BitCast is ONNX opset 26, which ONNX Runtime lacks: test_kernels_narrow checks its bytes
    assert ops == {getattr(c, "values", (c,))[0].op for c in CASES} | {"Gather", "BitCast"}
