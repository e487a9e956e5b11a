"""ONNX ops defined as functions: a node becomes the nodes of its function body.

ONNX defines many ops (Attention, RMSNormalization, Elu, ReduceL2, ...) as a function of other ops in
``onnx.defs``: a fixed body, or one built for the node's attributes and input types (a
*context-dependent* function). The importer expands such a node when no translator implements its
version: the body's nodes, their values renamed apart, with attribute references resolved, are
imported one by one under the body's own opset like any other node (and expand again if needed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import onnx
import onnx.defs
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto, TypeProto

MAX_DEPTH = 8  # nested expansions (a body op defined as a function in turn); ONNX's stay below 4


@dataclass(frozen=True)
class Expansion:
    """The nodes that replace one node, and the opset their op types are read in."""

    nodes: tuple[NodeProto, ...]
    opset: int


def schema_of(op_type: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | None:
    """The op's schema in force at ``opset``, or None when ONNX defines no such op."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def has_function(schema: onnx.defs.OpSchema | None) -> bool:
    return schema is not None and (schema.has_function or schema.has_context_dependent_function)


def function_body(schema: onnx.defs.OpSchema, node: NodeProto, opset: int,
                  input_types: Sequence[TypeProto | None]) -> FunctionProto | None:
    """The body ONNX defines for ``node`` at ``opset`` (None when it needs an input type it lacks)."""
    proto = FunctionProto()
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= opset] or list(schema.function_opset_versions)
        data = schema.get_function_with_opset_version(max(versions)) if versions else None
        if data:
            proto.ParseFromString(data)
            return proto
        proto.CopyFrom(schema.function_body)
        return proto
    if any(t is None for t in input_types):
        return None
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not versions:
        return None
    data = schema.get_context_dependent_function_with_opset_version(
        max(versions), node.SerializeToString(), [t.SerializeToString() for t in input_types])
    if not data:
        return None
    proto.ParseFromString(data)
    return proto


def expand(node: NodeProto, body: FunctionProto, schema: onnx.defs.OpSchema, opset: int, prefix: str,
           bound: Collection[str] = ()) -> Expansion:
    """``body``'s nodes with the node's values in place of the formal ones and the rest renamed
    ``{prefix}/name``; attribute references take the node's attribute or the default. Outputs in
    ``bound`` (a translator gave them) are renamed too: the body's copies are left unused."""
    rename = {formal: actual for formal, actual in zip(body.input, node.input)}
    rename.update({formal: "" for formal in list(body.input)[len(node.input):]})  # optional inputs left out
    rename.update({formal: actual for formal, actual in zip(body.output, node.output) if actual not in bound})
    given = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in body.attribute_proto}
    for name, spec in schema.attributes.items():
        if name not in defaults and spec.default_value.type != AttributeProto.UNDEFINED:
            defaults[name] = spec.default_value

    def value(name: str) -> str:
        if name == "":
            return ""
        if name not in rename:
            rename[name] = f"{prefix}/{name}"
        return rename[name]

    scope = set(body.input) | {o for n in body.node for o in n.output}  # what sub-graphs may refer to
    nodes = []
    for n in body.node:
        out = NodeProto()
        out.CopyFrom(n)
        out.name = f"{prefix}/{n.name or (n.output[0] if n.output else n.op_type)}"
        del out.input[:]
        del out.output[:]
        out.input.extend(value(i) for i in n.input)
        out.output.extend(value(o) for o in n.output)
        del out.attribute[:]
        for a in n.attribute:
            if a.ref_attr_name:
                ref = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if ref is None:
                    continue  # an optional attribute the node leaves out: the body op's default
                resolved = AttributeProto()
                resolved.CopyFrom(ref)
                resolved.name = a.name
                out.attribute.append(resolved)
            elif a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):  # If, Loop, Scan in the body
                renamed = AttributeProto()
                renamed.CopyFrom(a)
                for g in [renamed.g] if a.type == AttributeProto.GRAPH else renamed.graphs:
                    _rename_outer(g, lambda name: value(name) if name in scope else name)
                out.attribute.append(renamed)
            else:
                out.attribute.append(a)
        nodes.append(out)
    versions = {o.domain: o.version for o in body.opset_import}
    return Expansion(tuple(nodes), versions.get("", versions.get("ai.onnx", opset)))


def _rename_outer(graph: GraphProto, rename: Callable[[str], str]) -> None:
    """Rename, in place, the values a sub-graph (and the sub-graphs in it) takes from the function body
    around it; ONNX's names are unique across scopes, so what it defines itself is never renamed."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = rename(name)
        for a in node.attribute:
            for g in [a.g] if a.HasField("g") else a.graphs:
                _rename_outer(g, rename)
    for out in graph.output:
        out.name = rename(out.name)
