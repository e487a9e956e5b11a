"""The verifier: the invariants every Graph must hold, checked between passes and after import."""

from __future__ import annotations

from ..errors import CuvilError, VerifyError
from .. import ops
from .dtypes import DType, bool_bytes_clean
from .graph import Graph
from .infer import infer_node
from .types import TensorType


def verify(graph: Graph) -> Graph:
    """Raise VerifyError naming the first broken invariant; return the graph for chaining."""
    defined: set[str] = set()

    def define(name: str, what: str) -> None:
        if not name:
            raise VerifyError(f"{what} has an empty value name")
        _unicode(name, f"value name of {what}")
        if name in defined:
            raise VerifyError(f"value {name!r} is defined twice ({what})")
        if name not in graph.types:
            raise VerifyError(f"value {name!r} ({what}) has no type")
        defined.add(name)

    if not graph.outputs:
        raise VerifyError("graph has no outputs")
    _unicode(graph.name, "the graph's name")
    for name in graph.inputs:
        define(name, "graph input")
        if graph.types[name].bounded:
            raise VerifyError(f"graph input {name!r} has a bounded type: only an op's result may")
    for name, arr in graph.constants.items():
        define(name, "constant")
        want = TensorType(DType.from_numpy(arr.dtype), tuple(arr.shape))
        if graph.types[name] != want:
            raise VerifyError(f"constant {name!r} is {want} but typed {graph.types[name]}")
        if arr.flags.writeable:
            raise VerifyError(f"constant {name!r} is writeable")
        if not bool_bytes_clean(arr):
            raise VerifyError(f"constant {name!r} holds bool bytes other than 0 and 1")
    node_names: set[str] = set()
    for node in graph.nodes:
        where = f"node {node.name!r} ({node.op})"
        if node.name in node_names:
            raise VerifyError(f"node name {node.name!r} is used twice")
        node_names.add(node.name)
        _unicode(node.name, "a node's name")
        opdef = ops.get_op(node.op)
        opdef.check_arity(len(node.inputs))
        if not _canonical(tuple(sorted(opdef.normalize_attrs(node.attr).items())), node.attrs):  # sorted, no repeats
            raise VerifyError(f"{where}: attributes are not in canonical form")
        for name in node.inputs:
            if name not in defined:
                raise VerifyError(f"{where} uses {name!r} before it is defined")
            if graph.types[name].bounded:  # its length is known only at run time: a graph output only
                raise VerifyError(f"{where} reads {name!r}, whose length is bounded: only a graph output may be")
        try:
            inferred = infer_node(node, graph.types)
        except CuvilError as e:
            raise VerifyError(str(e)) from None
        if len(inferred) != len(node.outputs):
            raise VerifyError(f"{where} has {len(node.outputs)} outputs, its op yields {len(inferred)}")
        for name, want in zip(node.outputs, inferred):
            define(name, where)
            if graph.types[name] != want:
                raise VerifyError(f"{where}: output {name!r} typed {graph.types[name]}, inferred {want}")
    for name in graph.outputs:
        if name not in defined:
            raise VerifyError(f"graph output {name!r} is never defined")
    extra = set(graph.types) - defined
    if extra:
        raise VerifyError(f"types given for unknown values: {sorted(extra)[:5]}")
    return graph


def _canonical(want: tuple, got: tuple) -> bool:
    """``got`` equals ``want`` in value and in each value's type (a list's items too): 1.0 for an int
    attribute or np.float64(0.1) for a float one compares equal, and then broke shape inference with a
    TypeError and printed as text that does not parse."""
    def same(a, b) -> bool:
        if type(a) is not type(b):
            return False
        return not isinstance(a, tuple) or all(type(x) is type(y) for x, y in zip(a, b))

    return want == got and all(k == j and same(a, b) for (k, a), (j, b) in zip(want, got))


def _unicode(text: str, what: str) -> None:
    """A name must be text UTF-8 can hold, as ONNX's are: a lone surrogate cannot be, and two of them printed
    (escaped, as the IR text prints any non-ASCII) like the one character they pair to, so two graphs had one
    text and read back as the second. (String attributes are each op's words, checked by its rule.)"""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise VerifyError(f"{what} holds a surrogate code point, which is not text") from None
