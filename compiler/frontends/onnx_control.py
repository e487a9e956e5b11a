"""ONNX control flow (If, Loop, Scan) imported by unrolling its sub-graphs into plain Cuvil ops.

Cuvil IR is a straight-line graph of static shapes, so a sub-graph is imported the way a function
body is: its nodes go through the importer again (``Host.subgraph``), once per branch taken or per
iteration, with the body's inputs bound to the values of that step. What each op becomes:

- **If** with a condition known at import (folded from static shapes, as exporters write it): the
  branch taken, nothing else. With a condition computed at run time: both branches and a ``Where``
  per output, which needs the two branches to give outputs of one type.
- **Scan**: the trip count is the scan inputs' static length on their axis; each iteration takes one
  slice per scan input, and the scan outputs are stacked with Unsqueeze + Concat. Scan 8 (a batch
  axis, no ``sequence_lens``) runs that once per batch row.
- **Loop**: the trip count and the condition must be known at import, iteration by iteration (the
  iteration number is a constant in the body, so a body condition that depends only on it folds).
  A trip count or condition computed at run time is unsupported, and a graph input that holds one
  can be fixed with ``constant_inputs``.

Bounds (hostile models): at most :data:`MAX_TRIPS` iterations per op, :data:`MAX_UNROLLED` body
nodes imported per model, and sub-graphs nested at most ``onnx_functions.MAX_DEPTH`` deep; going
past any of them is a :class:`LimitError` before the work is done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Union

import numpy as np
import onnx
from onnx import helper

from ..errors import LimitError
from ..ir.types import TensorType
from .builder import GraphBuilder, Unsupported
from .onnx_node import OnnxImportError, Probe

MAX_TRIPS = 4096  # iterations of one Loop or Scan (per batch row for Scan 8)
MAX_UNROLLED = 16_384  # sub-graph nodes imported per model, all control-flow ops together

VERSIONS: Mapping[str, tuple[int, ...]] = {
    "If": (1, 11, 13, 16, 19, 21, 23, 24, 25),
    "Loop": (1, 11, 13, 16, 19, 21, 23, 24, 25),
    "Scan": (8, 9, 11, 16, 19, 21, 23, 24, 25),
}
"""The op versions whose meaning the translators below implement (tensor values only)."""

LOOP_OPERAND_KINDS = {"trip count": "iu", "condition": "biu"}
"""The NumPy dtype kinds a Loop's trip count and condition may have (ONNX: int64 and bool); a float
one is refused, as ONNX Runtime refuses it: truncated, 1.5 ran once, and NaN had no integer at all."""

Value = Union[str, Probe, None]  # a Cuvil value, a batch probe, or None: poisoned (its cause reported)


class Host(Protocol):
    """What the control-flow translators need of the importer."""

    b: GraphBuilder

    def lookup(self, onnx_name: str) -> Value: ...

    def constant_of(self, onnx_name: str) -> np.ndarray | None:
        """The value's array when it is known at import."""

    def needs_constant_behind(self, onnx_name: str) -> None:
        """Name the graph inputs that would make the value known, fixed (``constant_inputs``)."""

    def subgraph(self, graph: onnx.GraphProto, bindings: Mapping[str, Value], depth: int) -> list[Value]: ...


def _attrs(node: onnx.NodeProto) -> dict:
    try:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}
    except Exception as e:  # an attribute of no or an unknown type
        raise OnnxImportError(f"node {node.name or node.op_type!r} ({node.op_type}) has a malformed attribute "
                              f"({type(e).__name__})") from None


def _ints(node: onnx.NodeProto, a: dict, key: str, count: int) -> list[int]:
    """A list-of-ints attribute (default: ``count`` zeros), which must hold ``count`` of them."""
    value = a.get(key, [0] * count)
    if not isinstance(value, list) or len(value) != count or not all(isinstance(v, int) for v in value):
        raise OnnxImportError(f"node {node.name or node.op_type!r} ({node.op_type}): attribute {key!r} must be "
                              f"{count} ints")
    return value


def _graph(node: onnx.NodeProto, key: str) -> onnx.GraphProto:
    graph = _attrs(node).get(key)
    if not isinstance(graph, onnx.GraphProto):
        raise OnnxImportError(f"node {node.name or node.op_type!r} ({node.op_type}) lacks its sub-graph {key!r}")
    return graph


def _inputs(host: Host, node: onnx.NodeProto) -> list[Value]:
    return [host.lookup(i) if i else None for i in node.input]


def _check_trips(what: str, trips: int, body: onnx.GraphProto) -> None:
    if trips > MAX_TRIPS:
        raise LimitError(f"{what} runs {trips} iterations; Cuvil unrolls at most {MAX_TRIPS}")
    if trips * len(body.node) > MAX_UNROLLED:
        raise LimitError(f"{what} unrolls into {trips * len(body.node)} nodes; Cuvil unrolls at most {MAX_UNROLLED}")


def _tensor(value: Value, what: str) -> str | None:
    if isinstance(value, Probe):
        raise Unsupported(f"{what} depends on the symbolic batch")
    return value


# --- element and stacking helpers -----------------------------------------------------------------
def _take(b: GraphBuilder, x: str | None, index: int, axis: int, hint: str) -> str | None:
    """``x``'s slice ``index`` on ``axis``, without that axis."""
    if x is None:
        return None
    part = b.add1("Slice", [x], name=f"{hint}/take", starts=[index], ends=[index + 1], axes=[axis], steps=[1])
    return b.add1("Squeeze", [part], name=f"{hint}/elem", axes=[axis])


def _stack(b: GraphBuilder, parts: Sequence[str | None], axis: int, hint: str) -> str | None:
    """The parts (one per iteration) stacked on a new ``axis``."""
    if not parts or any(p is None for p in parts):
        return None
    rank = b.type_of(parts[0]).rank
    if not -rank - 1 <= axis <= rank:
        raise OnnxImportError(f"node {hint!r}: scan output axis {axis} is out of range for rank {rank + 1}")
    axis %= rank + 1
    rows = [b.add1("Unsqueeze", [p], name=f"{hint}/row", axes=[axis]) for p in parts]
    return rows[0] if len(rows) == 1 else b.add1("Concat", rows, name=f"{hint}/stack", axis=axis)


# --- If -------------------------------------------------------------------------------------------
def import_if(host: Host, node: onnx.NodeProto, name: str, depth: int) -> list[Value]:
    then_g, else_g = _graph(node, "then_branch"), _graph(node, "else_branch")
    if not (node.input and node.input[0]):
        raise OnnxImportError(f"node {name!r} (If) lacks its condition input")
    known = host.constant_of(node.input[0])
    if known is not None:
        if known.size != 1:
            raise OnnxImportError(f"node {name!r} (If): the condition holds {known.size} values, not one")
        return host.subgraph(then_g if bool(known.reshape(-1)[0]) else else_g, {}, depth)
    cond = _tensor(_inputs(host, node)[0], "the condition")
    if cond is None:
        return [None] * len(node.output)
    b = host.b
    if b.type_of(cond).shape != ():
        if b.type_of(cond).numel() != 1:
            raise OnnxImportError(f"node {name!r} (If): the condition must hold one value")
        cond = b.add1("Reshape", [cond], name=f"{name}/cond", shape=[])
    then_v, else_v = host.subgraph(then_g, {}, depth), host.subgraph(else_g, {}, depth)
    if len(then_v) != len(else_v) or len(then_v) < len([o for o in node.output if o]):
        raise OnnxImportError(f"node {name!r} (If): its branches give {len(then_v)} and {len(else_v)} outputs "
                              f"for {len(node.output)}")
    out: list[Value] = []
    for t, e in zip(then_v, else_v):
        t, e = _tensor(t, "a branch output"), _tensor(e, "a branch output")
        if t is None or e is None:
            out.append(None)
            continue
        if b.type_of(t) != b.type_of(e):
            host.needs_constant_behind(node.input[0])
            raise Unsupported(f"a condition computed at run time picks between outputs of types "
                              f"{_show(b.type_of(t))} and {_show(b.type_of(e))}")
        out.append(b.add1("Where", [cond, t, e], name=f"{name}/select"))
    return out


def _show(t: TensorType) -> str:
    return f"{t.dtype.value}{list(t.shape)}"


# --- Scan -----------------------------------------------------------------------------------------
def import_scan(host: Host, node: onnx.NodeProto, name: str, depth: int, version: int) -> list[Value]:
    body, a = _graph(node, "body"), _attrs(node)
    m = a.get("num_scan_inputs", -1)
    if not isinstance(m, int):
        raise OnnxImportError(f"node {name!r} (Scan): num_scan_inputs must be an int")
    values = _inputs(host, node)
    if version == 8:
        if node.input and node.input[0]:
            raise Unsupported("sequence_lens")
        values = values[1:]
    n = len(values) - m
    if m < 1 or n < 0 or len(body.input) != n + m or len(body.output) < n:
        raise OnnxImportError(f"node {name!r} (Scan): {len(values)} inputs, num_scan_inputs={m} and a body of "
                              f"{len(body.input)} inputs and {len(body.output)} outputs do not agree")
    k = len(body.output) - n
    in_dirs = _ints(node, a, "directions" if version == 8 else "scan_input_directions", m)
    in_axes = [0] * m if version == 8 else _ints(node, a, "scan_input_axes", m)
    out_axes = [0] * k if version == 8 else _ints(node, a, "scan_output_axes", k)
    out_dirs = [0] * k if version == 8 else _ints(node, a, "scan_output_directions", k)
    states = list(values[:n])
    xs = [_tensor(x, "a scan input") for x in values[n:]]
    spec = _ScanSpec(body, in_axes, in_dirs, out_axes, out_dirs, name, depth)
    if version > 8:
        return _scan(host, spec, states, xs)
    return _scan_batched(host, spec, states, xs)


@dataclass(frozen=True)
class _ScanSpec:
    body: onnx.GraphProto
    in_axes: list[int]
    in_dirs: list[int]
    out_axes: list[int]
    out_dirs: list[int]
    name: str
    depth: int


def _scan(host: Host, s: _ScanSpec, states: list[Value], xs: list[str | None]) -> list[Value]:
    b, n = host.b, len(states)
    if any(x is None for x in xs):
        return [None] * len(s.body.output)
    axes, lengths = [], set()
    for x, axis in zip(xs, s.in_axes):
        t = b.type_of(x)
        if not -t.rank <= axis < t.rank:
            raise OnnxImportError(f"node {s.name!r} (Scan): scan axis {axis} is out of range for rank {t.rank}")
        axes.append(axis % t.rank)
        lengths.add(t.shape[axis % t.rank])
    if len(lengths) != 1 or not isinstance(trips := lengths.pop(), int):
        raise Unsupported("scan inputs of different or batch-dependent lengths")
    if trips == 0:
        raise Unsupported("an empty scan")
    _check_trips(f"node {s.name!r} (Scan)", trips, s.body)
    formal = [i.name for i in s.body.input]
    rows: list[list[Value]] = []
    for t in range(trips):
        elems = [_take(b, x, trips - 1 - t if d else t, axis, s.name) for x, axis, d in zip(xs, axes, s.in_dirs)]
        outs = host.subgraph(s.body, dict(zip(formal, states + elems)), s.depth)
        states = outs[:n]
        rows.append(outs[n:])
    scans = []
    for j, (axis, d) in enumerate(zip(s.out_axes, s.out_dirs)):
        parts = [_tensor(r[j], "a scan output") for r in rows]
        scans.append(_stack(b, parts[::-1] if d else parts, axis, s.name))
    return states + scans


def _scan_batched(host: Host, s: _ScanSpec, states: list[Value], xs: list[str | None]) -> list[Value]:
    """Scan 8: axis 0 of every input is a batch; each row is one Scan 9 over axis 0 of what is left."""
    b = host.b
    states_t = [_tensor(v, "a scan state") for v in states]
    if any(v is None for v in states_t + xs):
        return [None] * len(s.body.output)
    batches = {b.type_of(v).shape[0] for v in states_t + xs if b.type_of(v).rank}
    if len(batches) != 1 or not isinstance(rows := batches.pop(), int):
        raise Unsupported("inputs of different or symbolic batch sizes")
    _check_trips(f"node {s.name!r} (Scan)", rows, s.body)
    per_row = [_scan(host, s, [_take(b, v, r, 0, s.name) for v in states_t], [_take(b, x, r, 0, s.name) for x in xs])
               for r in range(rows)]
    return [_stack(b, [_tensor(row[j], "a scan output") for row in per_row], 0, s.name)
            for j in range(len(s.body.output))]


# --- Loop -----------------------------------------------------------------------------------------
def import_loop(host: Host, node: onnx.NodeProto, name: str, depth: int) -> list[Value]:
    body, b = _graph(node, "body"), host.b
    given = list(node.input) + [""] * max(0, 2 - len(node.input))
    if not given[0] and not given[1]:
        raise Unsupported("a loop with neither a trip count nor a condition never ends")
    trips = _known(host, given[0], "trip count") if given[0] else None
    going = bool(_known(host, given[1], "condition")) if given[1] else True
    carried = _inputs(host, node)[2:]
    n = len(carried)
    if len(body.input) != n + 2 or len(body.output) < n + 1:
        raise OnnxImportError(f"node {name!r} (Loop): a body of {len(body.input)} inputs and {len(body.output)} "
                              f"outputs does not fit {n} loop-carried values")
    if trips is not None:
        _check_trips(f"node {name!r} (Loop)", max(trips, 0), body)
    formal = [i.name for i in body.input]
    rows: list[list[Value]] = []
    i = 0
    while going and (trips is None or i < trips):
        if i >= MAX_TRIPS:
            raise LimitError(f"node {name!r} (Loop) runs more than {MAX_TRIPS} iterations, the most Cuvil unrolls")
        counter = b.constant(np.array(i, dtype=np.int64), hint=f"{name}/iteration")
        flag = b.constant(np.array(going), hint=f"{name}/cond")
        outs = host.subgraph(body, dict(zip(formal, [counter, flag, *carried])), depth)
        if given[1] and outs[0] is None:  # poisoned: its cause is reported
            return [None] * len(node.output)
        if given[1]:
            going = _condition(b, _tensor(outs[0], "the loop condition"))
        carried = outs[1:n + 1]
        rows.append(outs[n + 1:])
        i += 1
    k = len(body.output) - n - 1
    if not rows:
        if any(node.output[n:]):
            raise Unsupported("scan outputs of a loop that runs no iteration")
        return carried
    return carried + [_stack(b, [_tensor(r[j], "a scan output") for r in rows], 0, name) for j in range(k)]


def _known(host: Host, onnx_name: str, what: str) -> int:
    value = host.constant_of(onnx_name)
    if value is None:
        host.needs_constant_behind(onnx_name)
        raise Unsupported(f"a {what} computed at run time")
    return _scalar(value, what, repr(onnx_name))


def _scalar(value: np.ndarray, what: str, where: str) -> int:
    if value.size != 1:
        raise OnnxImportError(f"the loop's {what} {where} holds {value.size} values, not one")
    if value.dtype.kind not in LOOP_OPERAND_KINDS[what]:
        raise OnnxImportError(f"the loop's {what} {where} is {value.dtype}, not an integer"
                              + (" or bool" if "b" in LOOP_OPERAND_KINDS[what] else ""))
    return int(value.reshape(-1)[0])


def _condition(b: GraphBuilder, cond: str) -> bool:
    value = b.value_of(cond)
    if value is None:
        raise Unsupported("a loop condition computed at run time")
    return bool(_scalar(value, "condition", "computed by its body"))


TRANSLATORS: Mapping[str, Callable[[Host, onnx.NodeProto, str, int, int], list[Value]]] = {
    "If": lambda host, node, name, depth, version: import_if(host, node, name, depth),
    "Loop": lambda host, node, name, depth, version: import_loop(host, node, name, depth),
    "Scan": import_scan,
}
