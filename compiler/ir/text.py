"""The text form of a Graph: readable enough to debug with, exact enough to round-trip.

    graph "mlp" (x: f32[N,784]) -> (y) {
      const fc.weight: f32[10,784]
      y: f32[N,10] = Gemm @fc (x, fc.weight) {alpha=1.0, beta=1.0, transA=0, transB=1}
    }
    data fc.weight "<base64 of the little-endian bytes>"

Floats print with ``repr`` (shortest exact round-trip), except a float that is exactly a float32 (a
quantization scale, an ONNX attribute) whose float32 shortest form is shorter: that form marked
``f`` (``0.002430162f`` rather than ``0.00243016192689538``); the reader rounds it to float32,
which gives back the same bits. ``print_graph(g, data=False)`` omits the
data section; ``parse_graph(text, constants=...)`` then takes the arrays from elsewhere (a bundle).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping

import numpy as np

from ..errors import CuvilError, LimitError, ParseError
from .. import ops
from ..ops.registry import AttrKind, coerce_attr
from .dtypes import DType
from .graph import Graph, Node
from .limits import DEFAULT_LIMITS, Limits, check_node_arity, check_operands, check_type, check_values
from .types import Batch, TensorType

_BARE = re.compile(r"[A-Za-z_/][A-Za-z0-9_./\-]*")
_KEYWORDS = {"graph", "const", "data", "inf", "nan", "N"}
_F32_MAX = float(np.finfo(np.float32).max)


def _name(s: str) -> str:
    return s if _BARE.fullmatch(s) and s not in _KEYWORDS else json.dumps(s)


def _float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    text = repr(x)
    if abs(x) <= _F32_MAX and float(np.float32(x)) == x:
        short = str(np.float32(x)) + "f"
        if len(short) < len(text) and _number(short) == x:
            return short
    return text


def _number(token: str) -> float:
    """A float token's value: one marked ``f`` is the float32 nearest its decimal."""
    marked = token.endswith("f") and not token.endswith("inf")
    if not marked:
        return float(token)
    with np.errstate(over="ignore"):  # "1e39f" rounds to inf quietly: NumPy's RuntimeWarning is an error under -W error
        return float(np.float32(float(token[:-1])))


def _int(token: str, line: int) -> int:
    """``int(token)``, whose ValueError past 4,300 digits (Python's guard on the conversion) is a ParseError."""
    try:
        return int(token)
    except ValueError:
        raise ParseError(f"line {line}: an integer of {len(token)} characters") from None


def _attr(kind: AttrKind, value) -> str:
    if kind is AttrKind.INT:
        return str(value)
    if kind is AttrKind.FLOAT:
        return _float(value)
    if kind is AttrKind.STRING:
        return json.dumps(value)
    if kind is AttrKind.INTS:
        return "[" + ",".join(str(v) for v in value) + "]"
    if kind is AttrKind.FLOATS:
        return "[" + ",".join(_float(v) for v in value) + "]"
    return value.value  # DType


def print_graph(graph: Graph, data: bool = True) -> str:
    lines = []
    ins = ", ".join(f"{_name(n)}: {graph.types[n]}" for n in graph.inputs)
    outs = ", ".join(_name(n) for n in graph.outputs)
    lines.append(f"graph {json.dumps(graph.name)} ({ins}) -> ({outs}) {{")
    for cname in graph.constants:
        lines.append(f"  const {_name(cname)}: {graph.types[cname]}")
    for node in graph.nodes:
        spec = ops.get_op(node.op).attrs
        lhs = ", ".join(f"{_name(o)}: {graph.types[o]}" for o in node.outputs)
        args = ", ".join(_name(i) for i in node.inputs)
        # Each value as the reader's Node.make coerces it: verify compares with ==, so np.float64(0.1)
        # (whose repr is "np.float64(0.1)") and 1.0 for an int pass as canonical.
        attrs = ", ".join(f"{k}={_attr(spec[k].kind, coerce_attr(node.op, k, spec[k].kind, v))}" for k, v in node.attrs)
        lines.append(f"  {lhs} = {node.op} @{_name(node.name)} ({args})" + (f" {{{attrs}}}" if attrs else ""))
    lines.append("}")
    if data:
        for cname, arr in graph.constants.items():
            raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            lines.append(f"data {_name(cname)} \"{base64.b64encode(raw).decode()}\"")
    return "\n".join(lines) + "\n"


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>"[^"\\]*(?:\\.[^"\\]*)*")
  | (?P<num>-?(?:(?:inf|nan)(?![A-Za-z0-9_./\-])|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?f?))
  | (?P<name>[A-Za-z_/][A-Za-z0-9_./\-]*)
  | (?P<punct>->|<=|[()\[\]{},:=@])
  )""",
    re.VERBOSE,
)


class _Tokens:
    """The token stream, scanned lazily with one token of lookahead: memory stays that of the graph
    being built, never a list of every token (8 MiB of text made 773 MiB of tokens)."""

    def __init__(self, text: str, limits: Limits = DEFAULT_LIMITS):
        self.text = text
        self.limits = limits
        self.pos = 0
        self.line = 1  # of the token last taken
        self._ahead: tuple[str, str, int] | None = None
        self._scan()

    def _scan(self) -> None:
        text, pos = self.text, self.pos
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            rest = text[pos:].lstrip()
            if rest:
                line = self.line + text.count("\n", pos, len(text) - len(rest))
                raise ParseError(f"line {line}: unexpected {rest[:20]!r}")
            self._ahead, self.pos = None, len(text)
            return
        line = (self._ahead[2] if self._ahead else 1) + text.count("\n", pos, m.start(m.lastgroup))
        self._ahead, self.pos = (m.lastgroup, m.group(m.lastgroup), line), m.end()

    def peek(self) -> tuple[str, str, int] | None:
        return self._ahead

    def next(self) -> tuple[str, str, int]:
        tok = self._ahead
        if tok is None:
            raise ParseError("unexpected end of text")
        self.line = tok[2]
        self._scan()
        return tok

    def expect(self, value: str) -> None:
        kind, val, line = self.next()
        if val != value or kind == "str":
            raise ParseError(f"line {line}: expected {value!r}, got {val!r}")

    def accept(self, value: str) -> bool:
        tok = self._ahead
        if tok and tok[1] == value and tok[0] != "str":
            self.next()
            return True
        return False

    def name(self) -> str:
        kind, val, line = self.next()
        if kind == "str":
            return _unquote(val, line)
        if kind == "name":
            return val
        raise ParseError(f"line {line}: expected a name, got {val!r}")

    def type(self) -> TensorType:
        dtype = DType.parse(self.name())
        self.expect("[")
        dims: list = []
        bounded = None  # the dimension marked "<=" (types.TensorType.bounded_axis)
        while not self.accept("]"):
            if dims:
                self.expect(",")
            if self.accept("<="):
                if bounded is not None:
                    raise ParseError(f"line {self.peek()[2] if self.peek() else '?'}: two bounded dimensions")
                bounded = len(dims)
            kind, val, line = self.next()
            if kind == "num" and self.peek() and self.peek()[1] == "N" and self.peek()[0] == "name":
                self.next()
                factor = _int(val, line) if val.isdigit() else 0
                if factor < 1:
                    raise ParseError(f"line {line}: bad dimension {val}N")
                dims.append(Batch(factor))
            elif kind == "num" and val.isdigit():
                dims.append(_int(val, line))
            elif kind == "name" and val == "N":
                dims.append(Batch(1))
            else:
                raise ParseError(f"line {line}: bad dimension {val!r}")
            check_type(f"line {line}", dims, self.limits)
        return TensorType(dtype, tuple(dims), bounded)

    def scalar(self, kind: AttrKind):
        tkind, val, line = self.next()
        if kind is AttrKind.STRING:
            if tkind != "str":
                raise ParseError(f"line {line}: expected a string, got {val!r}")
            return _unquote(val, line)
        if kind is AttrKind.DTYPE:
            return DType.parse(val)
        if tkind != "num":
            raise ParseError(f"line {line}: expected a number, got {val!r}")
        if kind in (AttrKind.INT, AttrKind.INTS):
            if not re.fullmatch(r"-?\d+", val):
                raise ParseError(f"line {line}: expected an integer, got {val!r}")
            return _int(val, line)
        return _number(val)

    def attr_value(self, kind: AttrKind):
        if kind in (AttrKind.INTS, AttrKind.FLOATS):
            self.expect("[")
            vals = []
            while not self.accept("]"):
                if vals:
                    self.expect(",")
                vals.append(self.scalar(kind))
                if len(vals) > self.limits.max_attr_items:
                    raise LimitError(f"line {self.line}: a list attribute of more than {self.limits.max_attr_items} "
                                     "items, the limit")
            return tuple(vals)
        return self.scalar(kind)


def _unquote(token: str, line: int) -> str:
    try:
        return json.loads(token)
    except ValueError:
        raise ParseError(f"line {line}: bad string {token[:20]}") from None


def parse_type(text: str) -> TensorType:
    """A tensor type from its printed form (``str(TensorType)``, as a bundle's manifest names its
    inputs); ParseError for anything else."""
    tokens = _Tokens(text)
    t = tokens.type()
    if tokens.peek() is not None:
        raise ParseError(f"unexpected {tokens.peek()[1]!r} after the type {text[:40]!r}")
    return t


def parse_graph(text: str, constants: Mapping[str, np.ndarray] | None = None,
                limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Parse the text form; ``constants`` supplies weights when the text has no data section.

    Memory grows with the graph as it is built, and stops at ``limits`` (nodes, values, operands per
    node and in all, rank and dimensions): past one, a LimitError, before the rest of the text is read.
    """
    t = _Tokens(text, limits)
    t.expect("graph")
    name = t.name()
    types: dict[str, TensorType] = {}
    inputs: list[str] = []
    t.expect("(")
    while not t.accept(")"):
        if inputs:
            t.expect(",")
        n = t.name()
        t.expect(":")
        types[n] = t.type()
        check_values(len(types), limits)
        inputs.append(n)
    t.expect("->")
    t.expect("(")
    outputs: list[str] = []
    while not t.accept(")"):
        if outputs:
            t.expect(",")
        outputs.append(t.name())
        check_values(len(outputs), limits, "outputs")
    t.expect("{")
    const_names: dict[str, None] = {}  # in order; a dict, as each data entry looks its name up (a list: quadratic)
    nodes: list[Node] = []
    operands = 0  # the nodes' inputs so far
    while not t.accept("}"):
        if t.accept("const"):
            n = t.name()
            t.expect(":")
            types[n] = t.type()
            check_values(len(types), limits)
            if not types[n].is_static or types[n].bounded:  # an array's type is neither (verify)
                raise ParseError(f"constant {n!r} has a symbolic or bounded type {types[n]}")
            const_names[n] = None
            continue
        if len(nodes) >= limits.max_nodes:
            raise LimitError(f"the graph has more than {limits.max_nodes} nodes, the limit")
        outs = []
        while True:
            o = t.name()
            t.expect(":")
            types[o] = t.type()
            check_values(len(types), limits)
            outs.append(o)
            if len(outs) > limits.max_node_outputs:
                check_node_arity(f"the node at line {t.line}", 0, len(outs), limits)
            if not t.accept(","):
                break
        t.expect("=")
        op = t.name()
        if op not in ops.OP_TABLE:
            raise ParseError(f"line {t.line}: unknown op {op!r}")
        spec = ops.get_op(op).attrs
        t.expect("@")
        node_name = t.name()
        t.expect("(")
        args: list[str] = []
        while not t.accept(")"):
            if args:
                t.expect(",")
            args.append(t.name())
            operands += 1
            if len(args) > limits.max_node_inputs:
                check_node_arity(f"node {node_name[:80]!r}", len(args), 0, limits)
            check_operands(operands, limits)
        attrs = {}
        if t.accept("{"):
            while not t.accept("}"):
                if attrs:
                    t.expect(",")
                key = t.name()
                t.expect("=")
                if key not in spec or key in attrs:
                    raise ParseError(f"{op} has no attribute {key!r}" if key not in spec else f"{op}: {key!r} given twice")
                attrs[key] = t.attr_value(spec[key].kind)
        try:
            nodes.append(Node.make(op, args, outs, **attrs).replace(name=node_name))  # "" too: make would rename it
        except CuvilError as e:  # a missing required attribute, or a value of the wrong kind
            raise ParseError(f"node {node_name!r}: {e}") from None
    data: dict[str, np.ndarray] = {}
    while t.peek() is not None:
        t.expect("data")
        n = t.name()
        kind, val, line = t.next()
        if kind != "str" or n not in const_names or n in data:
            raise ParseError(f"line {line}: bad data entry for {n!r}")
        ty = types[n]
        try:
            raw = base64.b64decode(_unquote(val, line), validate=True)
        except ValueError:
            raise ParseError(f"line {line}: data for {n!r} is not base64") from None
        if len(raw) != ty.nbytes():
            raise ParseError(f"data for {n!r} has {len(raw)} bytes, its type needs {ty.nbytes()}")
        arr = np.frombuffer(raw, dtype=ty.dtype.numpy.newbyteorder("<")).astype(ty.dtype.numpy)
        try:  # NumPy refuses a shape whose nonzero dimensions' product overflows, though it holds no bytes
            data[n] = arr.reshape(ty.shape)
        except ValueError as e:
            raise ParseError(f"data for {n!r}: {e}") from None
    source = data if constants is None else constants
    missing = [c for c in const_names if c not in source]
    if missing:
        raise ParseError(f"no data for constant(s) {missing[:5]}")
    return Graph(name, tuple(inputs), tuple(outputs), tuple(nodes), types, {c: source[c] for c in const_names})
