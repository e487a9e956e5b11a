"""Run one ONNX op in ONNX Runtime and the matching Cuvil op in the reference interpreter.

ONNX passes some operands as constant inputs where Cuvil uses attributes, so a check names both
forms: ``onnx_inputs`` (arrays; ``Const(arr)`` marks an initializer) and the Cuvil op's own inputs
and attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, run_reference, verify
from cuvil.compiler.ir.infer import infer_op
from cuvil.compiler.ops import get_op
from tests.ort_reference import session_options


def infer(op, shapes, dtype=DType.F32, **attrs):
    """Cuvil's inferred output types of ``op`` over inputs of ``shapes`` (all of ``dtype``)."""
    types = [TensorType(dtype, tuple(s)) for s in shapes]
    return infer_op(op, types, get_op(op).normalize_attrs(attrs))


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@dataclass(frozen=True)
class Const:
    value: np.ndarray


def run_ort(op: str, inputs: list, attrs: dict | None = None, n_outputs: int = 1, opset: int = 17) -> list[np.ndarray]:
    names, feeds, inits, vinfos = [], {}, [], []
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(x, Const):
            inits.append(numpy_helper.from_array(np.asarray(x.value), name))
        else:
            x = np.asarray(x)
            feeds[name] = x
            vinfos.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    graph = helper.make_graph([node], "single", vinfos, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 9)
    # ORT's exact int8 rewrite (tests.ort_reference) is for uint8 data: after it, int8 x int8 QLinearConv has
    # no kernel. It runs at the extended level; a single node fuses with nothing there.
    so = session_options(exact_int8=any(x.dtype == np.uint8 for x in feeds.values()))
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(outs, feeds)


def run_cuvil(op: str, inputs: list[np.ndarray], n_outputs: int = 1, **attrs) -> list[np.ndarray]:
    """Build a one-node Graph (so the shape rule and verifier run too) and interpret it."""
    types = {f"x{i}": TensorType(DType.from_numpy(x.dtype), x.shape) for i, x in enumerate(inputs)}
    outs = [f"y{i}" for i in range(n_outputs)]
    graph = infer_graph_types("single", types, {}, [Node.make(op, list(types), outs, **attrs)], outs)
    verify(graph)
    result = run_reference(graph, {f"x{i}": x for i, x in enumerate(inputs)})
    for o in outs:
        assert tuple(graph.types[o].shape) == result[o].shape, (graph.types[o], result[o].shape)
        assert graph.types[o].dtype.numpy == result[o].dtype
    return [result[o] for o in outs]


def assert_close(actual: list[np.ndarray], expected: list[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape, (a.shape, e.shape)
        assert a.dtype == e.dtype, (a.dtype, e.dtype)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
