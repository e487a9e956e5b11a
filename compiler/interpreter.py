"""The reference interpreter: the executable specification every compiled kernel is tested against."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import ops
from .errors import InterpreterError, LimitError
from .ir.dtypes import DType
from .ir.graph import Graph
from .ir.types import Batch, TensorType


def bind_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int | None]:
    """Check inputs against the graph's input types; return them and the batch size they imply."""
    return bind_types(graph.input_types, inputs)


def bind_types(types: Mapping[str, TensorType], inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int | None]:
    """:func:`bind_inputs` against input types alone (a bundle's manifest gives them without its graph)."""
    missing = [n for n in types if n not in inputs]
    extra = [n for n in inputs if n not in types]
    if missing or extra:
        raise InterpreterError(f"inputs do not match the graph: missing {missing}, unexpected {extra}")
    batch: int | None = None
    bound: dict[str, np.ndarray] = {}
    for name, want in types.items():
        arr = np.asarray(inputs[name])
        if DType.from_numpy(arr.dtype) != want.dtype:
            raise InterpreterError(f"input {name!r} has dtype {arr.dtype}, the graph wants {want.dtype.value}")
        if arr.ndim != want.rank:
            raise InterpreterError(f"input {name!r} has shape {arr.shape}, the graph wants {want}")
        for got, dim in zip(arr.shape, want.shape):
            if isinstance(dim, Batch):
                if got % dim.factor or got == 0 or (batch is not None and got != dim.bind(batch)):
                    raise InterpreterError(f"input {name!r} has shape {arr.shape}: inconsistent batch size for {want}")
                batch = got // dim.factor
            elif got != dim:
                raise InterpreterError(f"input {name!r} has shape {arr.shape}, the graph wants {want}")
        bound[name] = np.asarray(arr, order="C")
    return bound, batch


def run_reference(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``inputs`` with the op table's NumPy references; return the graph outputs."""
    env, _ = bind_inputs(graph, inputs)
    env.update(graph.constants)
    last_use = {name: i for i, node in enumerate(graph.nodes) for name in node.inputs}
    keep = set(graph.outputs)
    for i, node in enumerate(graph.nodes):
        opdef = ops.get_op(node.op)
        try:
            results = opdef.reference([env[n] for n in node.inputs], node.attr)
        except MemoryError:  # under the activation limit, but past this process's memory
            raise LimitError(f"node {node.name[:80]!r} ({node.op}): its values do not fit in this process's "
                             "memory") from None
        for name, value in zip(node.outputs, results):
            env[name] = np.asarray(value)
        for name in node.inputs:
            if last_use.get(name) == i and name not in keep and name not in graph.constants:
                env.pop(name, None)
    return {name: env[name] for name in graph.outputs}
