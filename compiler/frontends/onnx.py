"""The ONNX frontend: ``import_onnx`` turns an ONNX model into a verified Cuvil Graph.

**Opsets** are taken the way ONNX Runtime takes them: any opset up to the newest the installed
``onnx`` knows; a model below opset 9 is first lifted to opset 9 with ``onnx.version_converter``.
What decides is each node's *op version* (the ``since_version`` of its schema at the model's
opset, from ``onnx.defs``): every translator of :data:`onnx_ops.TABLE` declares the versions
whose meaning it implements (:data:`onnx_ops.VERSIONS`), and a node of another version is
unsupported, unless ONNX defines that op as a function of other ops: then the node is replaced by
its function body (``onnx_functions``), whatever its op, which imports like any other nodes.

Each node goes through the translator :data:`onnx_ops.TABLE` holds for its op_type, which emits
Cuvil ops through :class:`GraphBuilder` (so constant subgraphs fold on the spot). Unsupported ops,
forms, dtypes and domains are all collected, their outputs poisoned so later nodes are skipped
quietly, and :meth:`GraphBuilder.build` raises one UnsupportedModelError that names them all.
Malformed models raise :class:`OnnxImportError`; nothing raises a raw protobuf or onnx error.
ONNX ops outside op set v1 that exporters use for shape arithmetic (Mod, Range, ReduceProd, ...,
``onnx_ops.evaluated`` in the table) are evaluated by ONNX's reference implementation when their
inputs are known, and unsupported otherwise.

**Constant inputs.** Cuvil IR takes shapes, axes, bounds and the like as static attributes. A graph
input that a node needs as such (Reshape's shape, Slice's starts...) makes the model unsupported,
and the error names it (``UnsupportedModelError.constant_inputs``); ``constant_inputs={name: value}``
imports the model with those inputs fixed to constants.

**The batch dimension.** A symbolic (or negative) leading dimension of a graph input becomes Cuvil's
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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs
from onnx import helper

from ..errors import CuvilError
from ..ir.graph import Graph
from ..ir.infer import PROBES
from ..ir.types import N, Dim, TensorType
from . import onnx_source
from . import onnx_bounded, onnx_composed, onnx_pool, onnx_quant, onnx_recurrent, onnx_resample, onnx_shape, onnx_signal  # noqa: F401  (register their translators)
from .builder import GraphBuilder, Unsupported
from .onnx_functions import MAX_DEPTH, expand, function_body, has_function, schema_of
from .onnx_subgraphs import CONTROL_OPS, SubgraphHost, all_nodes
from .onnx_node import MALFORMED, ONNX_DTYPES, BatchDependentError, NodeCtx, OnnxImportError, Probe, onnx_dtype, tensor_value
from .onnx_ops import TABLE, VERSIONS, evaluate_foreign, evaluated

__all__ = ["import_onnx", "OnnxImportError", "BatchDependentError"]

LIFTED_TO = 9  # older models are converted to this opset first (onnx.version_converter)
NEWEST_OPSET = onnx.defs.onnx_opset_version()
_TENSOR_TYPES = {d: code for code, d in ONNX_DTYPES.items()}
_EXPAND = object()  # a translator's Unsupported on a node that ONNX defines as a function
_CONTROL = ("Control flow imports by unrolling: trip counts and conditions known at import (a graph input "
            "that holds one can be fixed with constant_inputs), or an If whose branches give outputs of one type")
HINTS = {  # op -> what the user can do, appended to the unsupported-op error
    "If": _CONTROL, "Loop": _CONTROL, "Scan": _CONTROL,
}
def import_onnx(model: str | os.PathLike | bytes | onnx.ModelProto, batch_size: int | None = None,
                constant_inputs: Mapping[str, Any] | None = None) -> Graph:
    """Import ``model`` (a path, serialized bytes or a ModelProto); ``batch_size`` binds a symbolic batch;
    ``constant_inputs`` fixes graph inputs to values (arrays of the input's type and shape)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise OnnxImportError(f"batch_size must be a positive int or None, got {batch_size!r}")
    return _Importer(onnx_source.load(model), batch_size, dict(constant_inputs or {})).run()


def _opset(proto: onnx.ModelProto) -> int:
    versions = {o.domain: o.version for o in proto.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        if any(n.domain in ("", "ai.onnx") for n in proto.graph.node):
            raise OnnxImportError("not a valid ONNX model: it imports no default-domain opset")
        return NEWEST_OPSET  # only other domains' ops, which are reported unsupported
    if not 1 <= version <= NEWEST_OPSET:
        raise OnnxImportError(f"the model uses ONNX opset {version}, which the installed onnx {onnx.__version__} "
                              f"does not know (opsets 1 to {NEWEST_OPSET}); a newer onnx package may")
    return version


def _lift(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model and its opset, converted to opset LIFTED_TO first when it is older."""
    version = _opset(proto)
    if version >= LIFTED_TO or (version == 8 and any(n.op_type == "Scan" for n in all_nodes(proto.graph))):
        return proto, version  # the converter's Scan 8 -> 9 drops the batch axis of graph inputs: Scan 8 imports as is
    from onnx import version_converter

    try:
        lifted = version_converter.convert_version(proto, LIFTED_TO)
    except Exception as e:  # the converter's own errors: an adapter it lacks, a malformed node...
        raise OnnxImportError(f"the model uses ONNX opset {version}; converting it to opset {LIFTED_TO} with "
                              f"onnx.version_converter failed ({type(e).__name__}: {str(e)[:200]})") from None
    return lifted, _opset(lifted)


class _Importer(SubgraphHost):
    def __init__(self, proto: onnx.ModelProto, batch_size: int | None, constant_inputs: dict[str, Any]):
        proto, self.opset = _lift(proto)
        self.graph, self.batch_size, self.constant_inputs = proto.graph, batch_size, constant_inputs
        self.b = GraphBuilder(self.graph.name or "onnx_model", source=f"ONNX model {self.graph.name!r}", hints=HINTS)
        self.b.reserve(vi.name for vi in (*self.graph.input, *self.graph.output))  # the interface keeps its names
        self.scope: set[str] = set()  # the ONNX values defined in the graph being imported (define)
        self.env: dict[str, str] = {}  # ONNX value name -> Cuvil value name
        self.probes: dict[str, Probe] = {}
        self.poisoned: set[str] = set()  # values downstream of something unsupported
        self.used = {i for n in all_nodes(self.graph) for i in n.input if i} | {o.name for o in self.graph.output}
        self.graph_inputs = frozenset(vi.name for vi in self.graph.input)
        self.needs_constant: set[str] = set()
        self.sources: dict[str, frozenset[str]] = {n: frozenset([n]) for n in self.graph_inputs}
        """ONNX value -> the integer graph inputs its value depends on through integer values not known
        at import (shape arithmetic: a crop size passed as an input); never data, through floats"""
        self.expansions = 0
        self.unrolled = 0
        self._opsets: list[int] = []  # the opset of each control-flow node being imported  # sub-graph nodes imported (onnx_control.MAX_UNROLLED)

    def run(self) -> Graph:
        self._initializers()
        self._inputs()
        self.import_nodes(self.graph, self.opset, 0)
        return self._outputs()

    # graph inputs and weights -------------------------------------------------------------------
    def _initializers(self, graph: onnx.GraphProto | None = None) -> None:
        graph = self.graph if graph is None else graph
        self.define([*(t.values.name for t in graph.sparse_initializer), *(t.name for t in graph.initializer)], "initializer")
        for t in graph.sparse_initializer:
            self._reject("sparse initializer", t.values.name, [t.values.name])
        for t in graph.initializer:
            try:
                value = tensor_value(t)
            except Unsupported as u:
                self._reject(f"ONNX {u.reason}", f"initializer {t.name}", [t.name])
                continue
            except OnnxImportError:
                raise
            except Exception as e:  # truncated raw_data, ...
                raise OnnxImportError(f"initializer {t.name!r} cannot be read: {e}") from None
            self.env[t.name] = self.b.weight(value, hint=t.name)

    def _inputs(self) -> None:
        unknown = sorted(set(self.constant_inputs) - {vi.name for vi in self.graph.input})
        if unknown:
            raise OnnxImportError(f"constant_inputs names {unknown}, which are not inputs of the graph")
        self.define_inputs(self.graph)
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
            if vi.name in self.constant_inputs:
                self.env[vi.name] = self._constant_input(vi.name, dtype, tt)
                continue
            if not tt.HasField("shape"):
                raise OnnxImportError(f"graph input {vi.name!r} has no shape; export the model with input shapes")
            dims: list[Dim] = []
            for i, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value >= 0:
                    dims.append(int(d.dim_value))
                elif i == 0 or (d.dim_param and d.dim_param in batch_params):
                    dims.append(N if self.batch_size is None else self.batch_size)
                else:
                    label = repr(d.dim_param) if d.dim_param else str(d.dim_value) if d.HasField("dim_value") else "?"
                    raise OnnxImportError(
                        f"graph input {vi.name!r}: dimension {i} is symbolic ({label}); Cuvil IR lets only the "
                        f"leading batch dimension vary (batch_size=<n> binds that one): export with static shapes")
            self.env[vi.name] = self.b.input(vi.name, TensorType(dtype, tuple(dims)))
            if self.env[vi.name] != vi.name:
                raise OnnxImportError(f"graph input {vi.name!r} cannot keep its name: another value took it first")

    def _constant_input(self, name: str, dtype, tt) -> str:
        value = np.asarray(self.constant_inputs[name])
        declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] if tt.HasField("shape") else None
        if value.dtype != dtype.numpy or (declared is not None and (
                len(declared) != value.ndim or any(d not in (None, 0, v) for d, v in zip(declared, value.shape)))):
            raise OnnxImportError(f"constant_inputs[{name!r}] is {value.dtype}{list(value.shape)}, the graph input is "
                                  f"{dtype.value}{declared}")
        return self.b.weight(value, hint=name)

    # nodes --------------------------------------------------------------------------------------
    def _node(self, index: int, node: onnx.NodeProto, opset: int, depth: int = 0) -> None:
        """Import one node under ``opset``: its translator, ONNX's evaluation, or its function body."""
        name = node.name or next((o for o in node.output if o), f"{node.op_type}_{index}")
        if node.domain not in ("", "ai.onnx"):
            return self._reject(f"{node.domain}.{node.op_type}", name, node.output)
        inputs = [i for i in node.input if i]
        schema = schema_of(node.op_type, opset)
        if schema is None:
            return self._reject(node.op_type, name, node.output)
        if node.op_type in CONTROL_OPS:
            return self._control(node, name, schema.since_version, opset, depth)
        fn = TABLE.get(node.op_type)
        version = schema.since_version
        foreign = fn is evaluated  # outside op set v1, but ONNX's reference folds it over constants
        translated = fn is not None and not foreign and version in VERSIONS.get(node.op_type, ())
        expandable = has_function(schema) and depth < MAX_DEPTH
        poisoned = any(i in self.poisoned for i in inputs)
        if not (translated or expandable or foreign) or (poisoned and not (translated or expandable)):
            why = f"{node.op_type} (version {version})" if fn is not None and not foreign else node.op_type
            return self._reject(why, name, node.output)
        if poisoned:  # its cause is reported already
            return self.poisoned.update(node.output)
        undefined = [i for i in inputs if i not in self.env and i not in self.probes]
        if undefined:
            raise OnnxImportError(f"node {name!r} ({node.op_type}) uses {undefined}, which nothing before it defines")
        known = all(i in self.probes or self.b.value_of(self.env[i]) is not None for i in inputs)
        roots = frozenset().union(*(self.sources.get(i, frozenset()) for i in inputs if i not in self.probes
                                    and self.b.value_of(self.env[i]) is None and not self.b.type_of(self.env[i]).dtype.is_float))
        self.sources.update((o, roots) for o in node.output if o)
        if foreign and known and inputs:  # shape arithmetic outside op set v1
            results = self._fold(node, name, lambda values: self._evaluate(node, name, values, opset))
        elif translated and known and any(i in self.probes for i in inputs):
            results = self._fold(node, name, lambda values: self._translate_constants(node, name, fn, values, opset))
        elif translated:
            needed = set(self.needs_constant)
            ctx = NodeCtx(node, name, opset, self.b, self.env, self.probes, self.graph_inputs, self.needs_constant,
                          self.sources)
            results = self._translate(ctx, fn, expandable)
            if results is _EXPAND or (expandable and results is not None and any(
                    out in self.used and (j >= len(results) or results[j] is None) for j, out in enumerate(node.output))):
                self.needs_constant.intersection_update(needed)  # the body may take them as they are
                if results is not _EXPAND:  # what the translator gave stays (LayerNormalization's Y)
                    self._bind(node, name, results, missing_ok=True)
                return self._expand(index, node, name, schema, opset, depth)
        elif expandable:
            return self._expand(index, node, name, schema, opset, depth)
        else:
            return self._reject(node.op_type, name, node.output)
        if results is not None:
            self._bind(node, name, results)

    def _expand(self, index: int, node: onnx.NodeProto, name: str, schema, opset: int, depth: int) -> None:
        """Import the node's function body in its place (see ``onnx_functions``)."""
        types = [self._type_proto(i) for i in node.input]
        try:
            body = function_body(schema, node, opset, types)
        except Exception as e:  # ONNX's function builder rejecting the node (bad attributes, types)
            raise OnnxImportError(f"node {name!r} ({node.op_type}) cannot be expanded into its ONNX function: "
                                  f"{type(e).__name__}: {str(e)[:200]}") from None
        if body is None:
            return self._reject(f"{node.op_type} (version {schema.since_version})", name, node.output)
        self.expansions += 1
        bound = {o for o in node.output if o in self.env or o in self.probes}
        expansion = expand(node, body, schema, opset, prefix=f"{name}#{self.expansions}", bound=bound)
        self.used.update(i for n in expansion.nodes for i in n.input if i)
        for inner in expansion.nodes:
            self._node(index, inner, expansion.opset, depth + 1)
        for out in node.output:
            if out and out not in self.env and out not in self.probes and out not in self.poisoned and out in self.used:
                self._reject(f"{node.op_type} (output {out!r})", name, [out])

    def _type_proto(self, onnx_name: str) -> onnx.TypeProto:
        """An input's type as ONNX writes it, for ONNX's context-dependent function builders."""
        if onnx_name in self.probes:
            at = self.probes[onnx_name].at[0]
            return helper.make_tensor_type_proto(onnx.TensorProto.INT64, list(at.shape))
        if onnx_name not in self.env:
            return onnx.TypeProto()  # an optional input left out (or poisoned: the body is never imported)
        t = self.b.type_of(self.env[onnx_name])
        dims = [d if isinstance(d, int) else "N" for d in t.shape]
        return helper.make_tensor_type_proto(_TENSOR_TYPES[t.dtype], dims)

    def _translate(self, ctx: NodeCtx, fn, expandable: bool = False) -> list | None:
        try:
            return list(fn(ctx))
        except Unsupported as u:
            if expandable:  # a form the translator lacks: ONNX's function body may still import
                return _EXPAND
            self._reject(f"{ctx.op} ({u.reason})" if u.reason else ctx.op, ctx.name, ctx.outputs)
        except OnnxImportError:
            raise
        except CuvilError as e:
            hint = ""
            if ctx.sees_batch():
                hint = " (if the model fixes the batch size, pass batch_size=<n> to import_onnx)"
            raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): {e}{hint}") from None
        except MALFORMED as e:  # malformed attributes
            raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}) is malformed ({type(e).__name__}: {e})") from e
        return None

    def _translate_constants(self, node: onnx.NodeProto, name: str, fn, values: dict, opset: int) -> list | None:
        """The translator over constant inputs, in a scratch builder that folds it completely."""
        sub = GraphBuilder("fold", budget=self.b.budget)
        env = {i: sub.constant(v, hint=i) for i, v in values.items()}
        results = self._translate(NodeCtx(node, name, opset, sub, env, {}), fn)
        if results is not None and any(isinstance(r, str) and sub.value_of(r) is None for r in results):
            raise BatchDependentError(f"node {name!r} ({node.op_type}): cannot evaluate its batch-dependent "
                                      "shape computation; pass batch_size=<n> to import_onnx")
        return None if results is None else [sub.value_of(r) if isinstance(r, str) else None for r in results]

    def _evaluate(self, node: onnx.NodeProto, name: str, values: dict, opset: int) -> list | None:
        try:
            return evaluate_foreign(node, opset, values)
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

    def _bind(self, node: onnx.NodeProto, name: str, results: list, missing_ok: bool = False) -> None:
        for j, out in enumerate(node.output):
            result = results[j] if j < len(results) else None
            if not out:
                continue
            if isinstance(result, Probe):
                self.probes[out] = result
            elif result is not None:
                self.env[out] = result
            elif out in self.used and not missing_ok:  # Dropout's mask, MaxPool's indices, training outputs...
                self._reject(f"{node.op_type} (output {j})", name, [out])

    def _reject(self, what: str, name: str, outputs: Sequence[str]) -> None:
        self.b.unsupported(what, name)
        self.poisoned.update(o for o in outputs if o)

    # result -------------------------------------------------------------------------------------
    def _outputs(self) -> Graph:
        """The graph outputs under their ONNX names, verbatim: a name that changed could be another output's."""
        names: list[str] = []
        given: dict[str, str] = {}  # Cuvil values renamed to an output's name
        for o in self.graph.output:
            if o.name in self.poisoned:
                continue
            if o.name in self.probes:
                raise BatchDependentError(f"graph output {o.name!r} is a batch-dependent shape value; "
                                          "pass batch_size=<n> to import_onnx")
            if o.name not in self.env:
                raise OnnxImportError(f"graph output {o.name!r} is never computed")
            if o.name in names:
                raise OnnxImportError(f"graph output {o.name!r} is listed twice; Cuvil names each output once")
            value = given.get(self.env[o.name], self.env[o.name])
            if value == o.name and value in self.b.inputs:
                raise OnnxImportError(f"graph output {o.name!r} is also a graph input; Cuvil computes every output "
                                      "into a value of its own: give the output another name (an Identity node)")
            given[value] = self.b.give_name(value, o.name) if value != o.name else value
            if given[value] != o.name:
                raise OnnxImportError(f"graph output {o.name!r} cannot keep its name: another value of the model took it")
            names.append(o.name)
        return self.b.build(names, constant_inputs=sorted(self.needs_constant))
