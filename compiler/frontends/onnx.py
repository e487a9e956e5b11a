"""The ONNX frontend: ``import_onnx`` turns an ONNX model (opsets 9 to 21) into a verified Cuvil Graph.

Each node goes through the translator :data:`onnx_ops.TABLE` holds for its op_type, which emits
Cuvil ops through :class:`GraphBuilder` (so constant subgraphs fold on the spot). Unsupported ops,
forms, dtypes and domains are all collected, their outputs poisoned so later nodes are skipped
quietly, and :meth:`GraphBuilder.build` raises one UnsupportedModelError that names them all.
Malformed models raise :class:`OnnxImportError`; nothing raises a raw protobuf or onnx error.
ONNX ops outside op set v1 that exporters use for shape arithmetic (Mod, Range, ReduceProd, ...,
``onnx_ops.evaluated`` in the table) are evaluated by ONNX's reference implementation when their
inputs are known, and unsupported otherwise.

**The batch dimension.** A symbolic (or 0/-1) leading dimension of a graph input becomes Cuvil's
``N`` (a dimension sharing its dim_param does too), or ``batch_size`` when one is given; any other
symbolic dimension is an error. Exporters compute shapes at run time (Shape -> Gather -> Unsqueeze
-> Concat -> Reshape), which cannot fold to one constant when ``N`` is in them. Such values are
*probed*, as ``ir/infer.py`` probes shape rules: ``Shape`` of a tensor with ``N`` becomes a
:class:`Probe` holding its value at two batch sizes, and every node whose inputs are all constants
or probes is translated twice over constant inputs (folding through the Cuvil references). A result
equal at both sizes is a plain constant; one that differs stays a probe. Reshape and Expand read a
probed shape back element-wise: equal values are static, ``k*probe`` is ``k*N``, which Reshape
writes as 0 (copy the input's dimension) or the single -1, and Expand as 1. Whatever cannot be
written that way (two batch-sized dims, a batch-sized ConstantOfShape feeding real data, ...)
raises :class:`BatchDependentError`, which tells the user to pass ``batch_size``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from ..errors import CuvilError
from ..ir.graph import Graph
from ..ir.infer import PROBES
from ..ir.types import N, Dim, TensorType
from .builder import GraphBuilder, Unsupported
from .onnx_node import BatchDependentError, NodeCtx, OnnxImportError, Probe, onnx_dtype, tensor_value
from .onnx_ops import TABLE, evaluate_foreign, evaluated

__all__ = ["import_onnx", "OnnxImportError", "BatchDependentError"]

OPSETS = range(9, 22)
_RECURRENT = ("Recurrent layers import from PyTorch instead: cuvil.import_model(module, example_inputs) "
              "unrolls them into op-set-v1 ops")
HINTS = {  # op -> what the user can do, appended to the unsupported-op error
    "LSTM": _RECURRENT, "GRU": _RECURRENT, "RNN": _RECURRENT,
    "If": "ONNX control flow is outside the op set (PyTorch exports data-dependent branches, and "
          "nn.LocalResponseNorm, this way)",
    "Loop": "ONNX control flow is outside the op set", "Scan": "ONNX control flow is outside the op set",
}
def import_onnx(model: str | os.PathLike | bytes | onnx.ModelProto, batch_size: int | None = None) -> Graph:
    """Import ``model`` (a path, serialized bytes or a ModelProto); ``batch_size`` binds a symbolic batch."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise OnnxImportError(f"batch_size must be a positive int or None, got {batch_size!r}")
    return _Importer(_load(model), batch_size).run()


def _load(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray, memoryview, str, os.PathLike)):
        try:
            if isinstance(model, (str, os.PathLike)):
                proto = onnx.load(os.fspath(model))
            else:
                proto = onnx.load_model_from_string(bytes(model))
        except OSError as e:
            raise OnnxImportError(f"cannot read ONNX model {os.fspath(model)!r}: {e.strerror or e}") from None
        except Exception as e:  # protobuf DecodeError, onnx external-data errors, ...
            raise OnnxImportError(f"not a valid ONNX model ({type(e).__name__}: {e})") from None
    else:
        raise TypeError(f"import_onnx takes a path, bytes or onnx.ModelProto, not {type(model).__name__}")
    if not proto.HasField("graph") or not proto.graph.output:
        raise OnnxImportError("not a valid ONNX model: it has no graph outputs")
    _check_names(proto)
    return proto


def _check_names(proto: onnx.ModelProto) -> None:
    """protobuf hands back proto2 strings that are not UTF-8 as bytes: reject them once, here."""
    g = proto.graph
    names = [g.name, *(o.domain for o in proto.opset_import), *(t.name for t in g.initializer)]
    for vi in (*g.input, *g.output):
        names.append(vi.name)
        names.extend(d.dim_param for d in vi.type.tensor_type.shape.dim)
    for n in g.node:
        names.extend((n.name, n.op_type, n.domain, *n.input, *n.output, *(a.name for a in n.attribute)))
    if not all(isinstance(name, str) for name in names):
        raise OnnxImportError("not a valid ONNX model: a name in it is not valid UTF-8")


def _opset(proto: onnx.ModelProto) -> int:
    versions = {o.domain: o.version for o in proto.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        raise OnnxImportError("not a valid ONNX model: it imports no default-domain opset")
    if version not in OPSETS:
        raise OnnxImportError(f"the model uses ONNX opset {version}; Cuvil imports opsets {OPSETS[0]} to "
                              f"{OPSETS[-1]} (onnx.version_converter can convert it)")
    return version


class _Importer:
    def __init__(self, proto: onnx.ModelProto, batch_size: int | None):
        self.graph, self.batch_size, self.opset = proto.graph, batch_size, _opset(proto)
        self.b = GraphBuilder(self.graph.name or "onnx_model", source=f"ONNX model {self.graph.name!r}", hints=HINTS)
        self.env: dict[str, str] = {}  # ONNX value name -> Cuvil value name
        self.probes: dict[str, Probe] = {}
        self.poisoned: set[str] = set()  # values downstream of something unsupported
        self.used = {i for n in self.graph.node for i in n.input if i} | {o.name for o in self.graph.output}

    def run(self) -> Graph:
        self._initializers()
        self._inputs()
        for index, node in enumerate(self.graph.node):
            self._node(index, node)
        return self._outputs()

    # graph inputs and weights -------------------------------------------------------------------
    def _initializers(self) -> None:
        for t in self.graph.sparse_initializer:
            self._reject("sparse initializer", t.values.name, [t.values.name])
        for t in self.graph.initializer:
            try:
                value = tensor_value(t)
            except Unsupported as u:
                self._reject(f"ONNX {u.reason}", f"initializer {t.name}", [t.name])
                continue
            except Exception as e:  # missing external data, truncated raw_data, ...
                raise OnnxImportError(f"initializer {t.name!r} cannot be read: {e}") from None
            self.env[t.name] = self.b.constant(value, hint=t.name)

    def _inputs(self) -> None:
        real = [vi for vi in self.graph.input if vi.name not in self.env and vi.name not in self.poisoned]
        batch_params = {vi.type.tensor_type.shape.dim[0].dim_param for vi in real
                        if vi.type.HasField("tensor_type") and vi.type.tensor_type.shape.dim} - {""}
        for vi in real:
            if not vi.type.HasField("tensor_type"):
                self._reject("non-tensor graph input", vi.name, [vi.name])
                continue
            tt = vi.type.tensor_type
            try:
                dtype = onnx_dtype(tt.elem_type)
            except Unsupported as u:
                self._reject(f"ONNX {u.reason}", f"input {vi.name}", [vi.name])
                continue
            if not tt.HasField("shape"):
                raise OnnxImportError(f"graph input {vi.name!r} has no shape; export the model with input shapes")
            dims: list[Dim] = []
            for i, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(int(d.dim_value))
                elif i == 0 or (d.dim_param and d.dim_param in batch_params):
                    dims.append(N if self.batch_size is None else self.batch_size)
                else:
                    label = repr(d.dim_param) if d.dim_param else str(d.dim_value) if d.HasField("dim_value") else "?"
                    raise OnnxImportError(
                        f"graph input {vi.name!r}: dimension {i} is symbolic ({label}); Cuvil IR lets only the "
                        f"leading batch dimension vary (batch_size=<n> binds that one): export with static shapes")
            self.env[vi.name] = self.b.input(vi.name, TensorType(dtype, tuple(dims)))

    # nodes --------------------------------------------------------------------------------------
    def _node(self, index: int, node: onnx.NodeProto) -> None:
        name = node.name or next((o for o in node.output if o), f"{node.op_type}_{index}")
        if node.domain not in ("", "ai.onnx"):
            return self._reject(f"{node.domain}.{node.op_type}", name, node.output)
        inputs = [i for i in node.input if i]
        fn = TABLE.get(node.op_type)
        foreign = fn is evaluated
        if fn is None or (foreign and any(i in self.poisoned for i in inputs)):
            return self._reject(node.op_type, name, node.output)
        if any(i in self.poisoned for i in inputs):  # its cause is reported already
            return self.poisoned.update(node.output)
        undefined = [i for i in inputs if i not in self.env and i not in self.probes]
        if undefined:
            raise OnnxImportError(f"node {name!r} ({node.op_type}) uses {undefined}, which nothing before it defines")
        known = all(i in self.probes or self.b.value_of(self.env[i]) is not None for i in inputs)
        if foreign:  # outside op set v1, but foldable over constants (shape arithmetic)
            if not (known and inputs):
                return self._reject(node.op_type, name, node.output)
            results = self._fold(node, name, lambda values: self._evaluate(node, name, values))
        elif known and any(i in self.probes for i in inputs):
            results = self._fold(node, name, lambda values: self._translate_constants(node, name, fn, values))
        else:
            results = self._translate(NodeCtx(node, name, self.opset, self.b, self.env, self.probes), fn)
        if results is not None:
            self._bind(node, name, results)

    def _translate(self, ctx: NodeCtx, fn) -> list | None:
        try:
            return list(fn(ctx))
        except Unsupported as u:
            self._reject(f"{ctx.op} ({u.reason})" if u.reason else ctx.op, ctx.name, ctx.outputs)
        except OnnxImportError:
            raise
        except CuvilError as e:
            hint = ""
            if ctx.sees_batch():
                hint = " (if the model fixes the batch size, pass batch_size=<n> to import_onnx)"
            raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): {e}{hint}") from None
        except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as e:  # malformed attributes
            raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}) is malformed ({type(e).__name__}: {e})") from e
        return None

    def _translate_constants(self, node: onnx.NodeProto, name: str, fn, values: dict) -> list | None:
        """The translator over constant inputs, in a scratch builder that folds it completely."""
        sub = GraphBuilder("fold")
        env = {i: sub.constant(v, hint=i) for i, v in values.items()}
        results = self._translate(NodeCtx(node, name, self.opset, sub, env, {}), fn)
        if results is not None and any(isinstance(r, str) and sub.value_of(r) is None for r in results):
            raise BatchDependentError(f"node {name!r} ({node.op_type}): cannot evaluate its batch-dependent "
                                      "shape computation; pass batch_size=<n> to import_onnx")
        return None if results is None else [sub.value_of(r) if isinstance(r, str) else None for r in results]

    def _evaluate(self, node: onnx.NodeProto, name: str, values: dict) -> list | None:
        try:
            return evaluate_foreign(node, self.opset, values)
        except Unsupported as u:
            self._reject(f"{node.op_type} ({u.reason})", name, node.output)
        except OnnxImportError:
            raise
        except Exception as e:  # the ONNX reference implementation rejecting a malformed node
            raise OnnxImportError(f"node {name!r} ({node.op_type}) cannot be evaluated: {type(e).__name__}: {e}") from e
        return None

    def _fold(self, node: onnx.NodeProto, name: str, evaluate) -> list | None:
        """Evaluate over known inputs, once per probe batch size if any is a Probe; what differs stays one."""
        per_probe = []
        for k in range(len(PROBES)):
            values = {i: self.probes[i].at[k] if i in self.probes else self.b.value_of(self.env[i])
                      for i in node.input if i}
            results = evaluate(values)
            if results is None:
                return None
            per_probe.append(results)
            if not any(i in self.probes for i in values):  # one evaluation serves both sizes
                per_probe.append(results)
                break
        out: list = []
        for j, (a, b) in enumerate(zip(*per_probe)):
            if a is None or b is None:
                out.append(None)
            elif a.shape == b.shape and np.array_equal(a, b):
                out.append(self.b.constant(a, hint=node.output[j] or name))
            elif a.size > 4096:
                raise BatchDependentError(f"node {name!r} ({node.op_type}) builds a batch-sized constant; "
                                          "pass batch_size=<n> to import_onnx")
            else:
                out.append(Probe((a, b)))
        return out

    def _bind(self, node: onnx.NodeProto, name: str, results: list) -> None:
        for j, out in enumerate(node.output):
            result = results[j] if j < len(results) else None
            if not out:
                continue
            if isinstance(result, Probe):
                self.probes[out] = result
            elif result is not None:
                self.env[out] = result
            elif out in self.used:  # Dropout's mask, MaxPool's indices, training outputs...
                self._reject(f"{node.op_type} (output {j})", name, [out])

    def _reject(self, what: str, name: str, outputs: Sequence[str]) -> None:
        self.b.unsupported(what, name)
        self.poisoned.update(o for o in outputs if o)

    # result -------------------------------------------------------------------------------------
    def _outputs(self) -> Graph:
        names = []
        for o in self.graph.output:
            if o.name in self.poisoned:
                continue
            if o.name in self.probes:
                raise BatchDependentError(f"graph output {o.name!r} is a batch-dependent shape value; "
                                          "pass batch_size=<n> to import_onnx")
            if o.name not in self.env:
                raise OnnxImportError(f"graph output {o.name!r} is never computed")
            names.append(self.env[o.name])
        return self.b.build(names)
