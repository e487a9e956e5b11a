"""What an ONNX translator sees of one node (:class:`NodeCtx`), and the ONNX frontend's own errors.

``onnx_ops`` (the translators) and ``onnx`` (the importer that drives them) both build on this
module; neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from ..errors import CuvilError
from ..ir.dtypes import DType
from ..ir.infer import PROBES
from ..ir.types import Batch, Dim, TensorType
from .builder import GraphBuilder, Unsupported

_MISSING = object()

MALFORMED = (TypeError, ValueError, IndexError, KeyError, ArithmeticError)
"""What a translator raises on a malformed node (a missing input, an attribute of the wrong kind, a
NaN where an int goes): the importer reports each as OnnxImportError, for plain and control-flow ops alike."""


class OnnxImportError(CuvilError):
    """The ONNX model is malformed, or a value in it cannot be represented in Cuvil IR."""


class BatchDependentError(OnnxImportError):
    """A shape computation depends on the symbolic batch in a way Cuvil IR cannot express."""


@dataclass(frozen=True)
class Probe:
    """A small integer tensor whose value depends on the batch: its values at the two probe sizes."""

    at: tuple[np.ndarray, np.ndarray]


ONNX_DTYPES = {
    TensorProto.FLOAT: DType.F32, TensorProto.DOUBLE: DType.F64, TensorProto.FLOAT16: DType.F16,
    TensorProto.INT8: DType.I8, TensorProto.UINT8: DType.U8, TensorProto.INT32: DType.I32,
    TensorProto.INT64: DType.I64, TensorProto.BOOL: DType.BOOL, TensorProto.INT16: DType.I16,
    TensorProto.UINT16: DType.U16, TensorProto.UINT32: DType.U32, TensorProto.UINT64: DType.U64,
    TensorProto.BFLOAT16: DType.BF16, TensorProto.FLOAT8E4M3FN: DType.F8E4M3FN,
    TensorProto.FLOAT8E4M3FNUZ: DType.F8E4M3FNUZ, TensorProto.FLOAT8E5M2: DType.F8E5M2,
    TensorProto.FLOAT8E5M2FNUZ: DType.F8E5M2FNUZ, TensorProto.FLOAT8E8M0: DType.F8E8M0,
    TensorProto.FLOAT4E2M1: DType.F4E2M1,
    TensorProto.INT4: DType.I4, TensorProto.UINT4: DType.U4, TensorProto.INT2: DType.I2, TensorProto.UINT2: DType.U2,
}


def onnx_dtype(code: int) -> DType:
    if code not in ONNX_DTYPES:
        raise Unsupported(f"dtype {TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else code}")
    return ONNX_DTYPES[code]


def tensor_value(t: TensorProto) -> np.ndarray:
    """A TensorProto as an array of a Cuvil dtype, or Unsupported naming the ONNX dtype.

    A model read from its path has its external data in place already (``onnx_source``); a tensor that
    still names an external file came as bytes or a ModelProto, which have no directory: ``onnx`` would
    read the file relative to the current directory, any file of the importing process's own."""
    onnx_dtype(t.data_type)
    if external_data_helper.uses_external_data(t):
        where = next((e.value for e in t.external_data if e.key == "location"), "")
        raise OnnxImportError(f"tensor {t.name!r} keeps its data in the external file {where!r}, which only a model "
                              "imported from its path can name (relative to the model's own directory)")
    return numpy_helper.to_array(t)


class NodeCtx:
    """What a translator sees of one node: attributes, inputs as Cuvil values, output naming."""

    probe_sizes = PROBES

    def __init__(self, node: onnx.NodeProto, name: str, opset: int, builder: GraphBuilder,
                 env: dict[str, str], probes: dict[str, Probe], graph_inputs: frozenset[str] = frozenset(),
                 needs_constant: set[str] | None = None, sources: Mapping[str, frozenset[str]] | None = None):
        """``needs_constant`` collects the ``graph_inputs`` that the node needed as constants, directly
        or through the values computed from them (``sources``: ONNX value -> those graph inputs)."""
        self.op, self.name, self.opset, self.b = node.op_type, name, opset, builder
        self.inputs, self.outputs = list(node.input), list(node.output)
        self._env, self._probes = env, probes
        self._attrs = {a.name: a for a in node.attribute}
        self._graph_inputs = graph_inputs
        self._needs_constant = set() if needs_constant is None else needs_constant
        self._sources = sources or {}

    # attributes ---------------------------------------------------------------------------------
    def raw_attrs(self) -> dict[str, Any]:
        return {k: helper.get_attribute_value(a) for k, a in self._attrs.items()}

    def attr(self, key: str, default: Any = _MISSING) -> Any:
        if key not in self._attrs:
            if default is _MISSING:
                raise OnnxImportError(f"node {self.name!r} ({self.op}) lacks its required attribute {key!r}")
            return default
        value = helper.get_attribute_value(self._attrs[key])
        if value is None:
            raise OnnxImportError(f"node {self.name!r} ({self.op}): attribute {key!r} has no value")
        if isinstance(value, bytes):
            return value.decode()
        return [v.decode() if isinstance(v, bytes) else v for v in value] if isinstance(value, list) else value

    # inputs -------------------------------------------------------------------------------------
    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] != ""

    def _name(self, i: int) -> str:
        if not self.has(i):
            raise OnnxImportError(f"node {self.name!r} ({self.op}) lacks its required input {i}")
        if self.inputs[i] in self._probes:
            self.batch_dependent(f"input {self.inputs[i]!r}")
        return self.inputs[i]

    def x(self, i: int) -> str:
        return self._env[self._name(i)]

    def xs(self) -> list[str]:
        """The given inputs (Cuvil's optional inputs are a suffix, so stop at the first gap)."""
        n = next((i for i in range(len(self.inputs)) if not self.has(i)), len(self.inputs))
        return [self.x(i) for i in range(n)]

    def sees_batch(self) -> bool:
        return any(not self.b.type_of(self._env[i]).is_static for i in self.inputs if i in self._env)

    def type(self, i: int) -> TensorType:
        return self.b.type_of(self.x(i))

    def const(self, i: int) -> np.ndarray:
        value = self.b.value_of(self.x(i))
        if value is None:
            if self.inputs[i] in self._graph_inputs:  # constant_inputs can fix it
                self._needs_constant.add(self.inputs[i])
                raise Unsupported(f"input {i} must be a constant")
            self._needs_constant.update(self._sources.get(self.inputs[i], frozenset()) & self._graph_inputs)
            raise Unsupported(f"non-constant input {i}")
        return value

    def scalar(self, i: int, default: Any) -> Any:
        """A constant one-element operand (ONNX writes them as 0-d or [1]) as a Python number."""
        if not self.has(i):
            return default
        value = self.const(i).reshape(-1)
        if value.size != 1:
            raise OnnxImportError(f"node {self.name!r} ({self.op}): input {i} must hold one value, not {value.size}")
        return value[0].item()

    def dims(self, i: int) -> list[Dim]:
        """A shape operand: ints, with ``Batch`` where a probed value scales with the batch."""
        name = self.inputs[i] if self.has(i) else ""
        if name not in self._probes:
            return [int(v) for v in self.const(i).reshape(-1)]
        (a, b), (p, q) = self._probes[name].at, self.probe_sizes
        if a.shape != b.shape or a.ndim > 1:
            self.batch_dependent(f"shape operand {name!r}")
        dims: list[Dim] = []
        for u, v in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist()):
            if u == v:
                dims.append(int(u))
            elif u % p == 0 and v % q == 0 and u // p == v // q > 0:
                dims.append(Batch(u // p))
            else:
                self.batch_dependent(f"shape operand {name!r}")
        return dims

    def reshape_attr(self, dims: Sequence[Dim], t: TensorType, zero_copies: bool = False) -> list[int]:
        """A Reshape target without N: 0 where it copies the input's same dimension, else one -1."""
        out: list[int | None] = []
        for i, d in enumerate(dims):
            if isinstance(d, Batch):
                out.append(0 if zero_copies and i < t.rank and t.shape[i] == d else None)
            else:
                out.append(d)
        holes = [i for i, d in enumerate(out) if d is None]
        if len(holes) > 1 or (holes and -1 in out):
            self.batch_dependent("a reshape target with several batch-sized dimensions")
        if holes:
            out[holes[0]] = -1
        return out  # type: ignore[return-value]

    def batch_dependent(self, what: str) -> None:
        raise BatchDependentError(
            f"node {self.name!r} ({self.op}): {what} depends on the symbolic batch size in a way Cuvil IR "
            f"cannot express; pass batch_size=<n> to import_onnx to import it for a fixed batch")

    # outputs ------------------------------------------------------------------------------------
    def emit(self, op: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.emit_many(op, inputs, 1, **attrs)[0]

    def emit_many(self, op: str, inputs: Sequence[str], n: int, **attrs: Any) -> list[str]:
        names = [o or f"{self.name}:{i}" for i, o in enumerate((self.outputs + [""] * n)[:n])]
        return self.b.add(op, inputs, name=self.name, output_names=names, **attrs)

    def tmp(self, op: str, inputs: Sequence[str], suffix: str, **attrs: Any) -> str:
        """An intermediate value of a node that becomes several Cuvil ops."""
        hint = f"{self.name}/{suffix}"
        return self.b.add(op, inputs, name=hint, output_names=[hint], **attrs)[0]

    def constant(self, value: np.ndarray, hint: str) -> str:
        return self.b.constant(np.asarray(value), hint=hint or f"{self.name}/const")
