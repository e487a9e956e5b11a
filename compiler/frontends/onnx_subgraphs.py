"""The importer's side of ONNX control flow: sub-graphs imported in scopes of their own.

``onnx_control`` decides what an If, Loop or Scan becomes; :class:`SubgraphHost` (a base of the ONNX
importer) gives it what it needs: values by ONNX name, constants known at import, and
:meth:`SubgraphHost.subgraph`, which imports a branch or a body once more with its inputs bound. A
sub-graph sees the values of every scope around it (ONNX's outer-scope references) through a
``ChainMap``; what it defines stays in its scope. Within one scope every value is defined once
(:meth:`SubgraphHost.define`): ONNX graphs are in single static assignment form.
"""

from __future__ import annotations

from collections import ChainMap, Counter
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import onnx

from ..errors import CuvilError, LimitError
from .builder import Unsupported
from . import onnx_control
from .onnx_control import TRANSLATORS, VERSIONS, Value
from .onnx_functions import MAX_DEPTH
from .onnx_node import MALFORMED, OnnxImportError, Probe

CONTROL_OPS = frozenset(TRANSLATORS)


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and its sub-graphs (If branches, Loop and Scan bodies), recursively."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                yield from all_graphs(a.g)
            for sub in a.graphs:
                yield from all_graphs(sub)


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The nodes of the graph and of its sub-graphs."""
    for g in all_graphs(graph):
        yield from g.node


class SubgraphHost:
    """The ``onnx_control.Host`` methods of the importer (which sets the attributes used here)."""

    def _control(self, node: onnx.NodeProto, name: str, version: int, opset: int, depth: int) -> None:
        if version not in VERSIONS[node.op_type]:
            return self._reject(f"{node.op_type} (version {version})", name, node.output)
        if any(i in self.poisoned for i in node.input if i):
            return self.poisoned.update(node.output)
        self._opsets.append(opset)
        try:
            results = TRANSLATORS[node.op_type](self, node, name, depth, version)
        except Unsupported as u:
            return self._reject(f"{node.op_type} ({u.reason})", name, node.output)
        except (OnnxImportError, LimitError):
            raise
        except CuvilError as e:
            raise OnnxImportError(f"node {name!r} ({node.op_type}): {e}") from None
        except MALFORMED as e:  # an input or attribute missing or of the wrong kind
            raise OnnxImportError(f"node {name!r} ({node.op_type}) is malformed ({type(e).__name__}: {e})") from e
        finally:
            self._opsets.pop()
        for out, result in zip(node.output, results):
            if not out:
                continue
            if result is None:
                self.poisoned.add(out)
            elif isinstance(result, Probe):
                self.probes[out] = result
            else:
                self.env[out] = result

    def define(self, names: Iterable[str], what: str) -> None:
        """Record values defined in the current scope; one defined twice is a malformed model (the later
        definition silently won, ONNX Runtime refuses it)."""
        for name in names:
            if name in self.scope:
                raise OnnxImportError(f"value {name!r} is defined twice ({what})")
            if name:
                self.scope.add(name)

    def define_inputs(self, graph: onnx.GraphProto) -> None:
        """A graph's inputs; one that is also an initializer is that value's default (ONNX IR 4 and later),
        and one before IR 4 lists every initializer: that input defines nothing new."""
        counts = Counter(i.name for i in graph.input)
        twice = next((n for n, k in counts.items() if k > 1), None)
        if twice is not None:
            raise OnnxImportError(f"value {twice!r} is defined twice (graph input)")
        self.define([n for n in counts if n not in self.scope], "graph input")

    def import_nodes(self, graph: onnx.GraphProto, opset: int, depth: int) -> None:
        """The graph's nodes in order, each output defined once in the current scope."""
        for index, node in enumerate(graph.node):
            self.define(node.output, f"output of node {node.name or node.op_type!r}")
            self._node(index, node, opset, depth)

    def lookup(self, onnx_name: str) -> Value:
        if onnx_name in self.poisoned:
            return None
        if onnx_name in self.probes:
            return self.probes[onnx_name]
        if onnx_name not in self.env:
            raise OnnxImportError(f"{onnx_name!r} is used before anything defines it")
        return self.env[onnx_name]

    def constant_of(self, onnx_name: str) -> np.ndarray | None:
        value = self.lookup(onnx_name)
        return self.b.value_of(value) if isinstance(value, str) else None

    def needs_constant_behind(self, onnx_name: str) -> None:
        """Record the graph inputs that ``onnx_name`` is computed from: fixed, they would make it known."""
        value = self.lookup(onnx_name)
        if not isinstance(value, str):
            return
        producer = {out: node for node in self.b.nodes for out in node.outputs}
        seen, todo = set(), [value]
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.b.inputs:  # a graph input keeps its ONNX name
                self.needs_constant.add(v)
            elif v in producer:
                todo.extend(producer[v].inputs)

    def subgraph(self, graph: onnx.GraphProto, bindings: Mapping[str, Value], depth: int) -> list[Value]:
        """Import ``graph`` (a branch or a body) in a scope of its own, its inputs bound to ``bindings``."""
        if depth + 1 >= MAX_DEPTH:
            raise LimitError(f"sub-graphs and functions nest more than {MAX_DEPTH} deep")
        self.unrolled += len(graph.node)
        if self.unrolled > onnx_control.MAX_UNROLLED:
            raise LimitError(f"control flow unrolls into more than {onnx_control.MAX_UNROLLED} nodes")
        outer = self.env, self.probes, self.poisoned, self.scope, self.b.claiming
        self.env, self.probes, self.poisoned = ChainMap({}, self.env), ChainMap({}, self.probes), set(self.poisoned)
        self.scope, self.b.claiming = set(), False  # the main graph's outputs are named there, not in here
        try:
            for formal, value in bindings.items():
                if value is None:
                    self.poisoned.add(formal)
                elif isinstance(value, Probe):
                    self.probes[formal] = value
                else:
                    self.env[formal] = value
            self._initializers(graph)
            self.define_inputs(graph)
            self.import_nodes(graph, self._opsets[-1], depth + 1)
            return [self.lookup(o.name) for o in graph.output]
        finally:
            self.env, self.probes, self.poisoned, self.scope, self.b.claiming = outer
