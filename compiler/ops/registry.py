"""The op table: every op defines, in one entry, its attributes, shape rule, checks, reference and traits.

Adding an op means adding one :class:`OpDef` to one family module (``elementwise``, ``nn``, ...), plus
its emitters in each backend. Shape rules and references see static shapes only (see ``ir.infer`` for
the batch symbol). The traits are what the planner, fusion, analysis, the backends and the frontends
ask of an op; none of them keeps its own list of ops.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import ShapeError, VerifyError
from ..ir.dtypes import DType
from ..ir.types import TensorType


class AttrKind(enum.Enum):
    INT = "int"
    FLOAT = "float"
    STRING = "string"
    INTS = "ints"
    FLOATS = "floats"
    DTYPE = "dtype"


REQUIRED = object()
AttrValue = int | float | str | tuple[int, ...] | tuple[float, ...] | DType


@dataclass(frozen=True)
class AttrSpec:
    kind: AttrKind
    default: Any = REQUIRED


Attrs = Mapping[str, AttrValue]
ShapeRule = Callable[[Sequence[TensorType], Attrs], Sequence[TensorType]]
Reference = Callable[[Sequence[np.ndarray], Attrs], Sequence[np.ndarray]]
InPlaceRule = Callable[[Attrs, int], bool]
"""May input ``i`` of a node with these attributes hand its bytes to the output (see OpDef.shares)?"""
JoinRule = Callable[[Attrs, Sequence[TensorType], TensorType], bool]
"""Is the output, of these static operand and result types, just its operands' bytes end to end (OpDef.joins)?"""
FlopRule = Callable[[Attrs, Sequence[TensorType], Sequence[TensorType]], int]
"""Operations one node performs, from its attributes and static operand and result types."""


def per_output_element(a: Attrs, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> int:
    """The default FLOP rule: one operation per output element."""
    return sum(math.prod(t.shape) for t in outs)


def no_flops(a: Attrs, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> int:
    """Pure data movement."""
    return 0


@dataclass(frozen=True)
class OpDef:
    """One op: ``shape_rule`` gives the result types (and raises ShapeError on operands it rejects).

    Traits, each answered for every op:

    * ``view``: the output is input 0's bytes under another shape or dtype (the planner aliases them; a
      backend then emits nothing).
    * ``elementwise``: output element i is computed from element i of every operand broadcast to
      the output's shape, and from nothing else.
    * ``inplace``: for ops that are not elementwise, which inputs (under which attributes) may share
      the output's bytes; see :meth:`shares`.
    * ``joins``: for which static types the output is its operands' bytes laid end to end (Concat
      with only ones before its axis); see :meth:`operand_offsets`. The planner may then place each
      operand at its offset in the output, so a backend emits nothing.
    * ``fusable``: may be a step of a ``FusedElementwise`` program (elementwise, its result of its
      operands' dtype, its element code in every backend's element table).
    * ``narrow_ok``: takes the storage-only dtypes (``DType.is_narrow``: bfloat16, float8, float4,
      int4, int2), which it converts (Cast) or moves without arithmetic; :meth:`infer` refuses
      them for every other op (views always take them: they only relabel bytes).
    * ``float_only``: input 0 (and every operand of its dtype) must be a float; :meth:`infer` checks it.
    * ``flops``: the :data:`FlopRule` of ``cuvil inspect`` (multiply-add = 2; default one per output element).
    * ``foldable``: a node whose inputs are all constants may be replaced by its result (false for
      DequantizeLinear: folded, int8 weights would be stored as the float32 they stand for).
    * ``same_as_onnx``: the ONNX op of this name has exactly these inputs, attributes and defaults,
      so the ONNX frontend imports it as it is.
    * ``run_time_check``: the reference refuses some operand *values* (Gather: an index out of
      range), which only a run can see. Native code then touches nothing outside its tensors,
      sets the model's fault word (``LoweredModel.fault_offset``), and the runtime raises.
    """

    name: str
    shape_rule: ShapeRule
    reference: Reference
    attrs: Mapping[str, AttrSpec] = field(default_factory=dict)
    min_inputs: int = 1
    max_inputs: int | None = 1  # None: variadic
    doc: str = ""
    view: bool = False
    elementwise: bool = False
    inplace: InPlaceRule | None = None
    joins: JoinRule | None = None
    fusable: bool = False
    float_only: bool = False
    narrow_ok: bool = False
    flops: FlopRule = per_output_element
    foldable: bool = True
    same_as_onnx: bool = False
    run_time_check: bool = False

    def infer(self, ts: Sequence[TensorType], attrs: Attrs) -> Sequence[TensorType]:
        """The result types: the dtype traits first, then the shape rule."""
        if not (self.narrow_ok or self.view):
            narrow = sorted({t.dtype.value for t in ts if t.dtype.is_narrow})
            require(not narrow, f"{self.name}: no arithmetic on storage-only dtype(s) {', '.join(narrow)}")
        if self.float_only and ts:
            require(ts[0].dtype.is_float, f"{self.name}: needs a float operand, got {ts[0].dtype.value}")
        return self.shape_rule(ts, attrs)

    def shares(self, attrs: Attrs, i: int) -> bool:
        """The in-place rule: may input ``i`` hand its bytes to the output?

        A view's input 0 always may (same bytes, another shape). Otherwise the input must also have
        the output's exact type (the planner and its checker test that): any input of an elementwise
        op may, as element i is read only to compute element i; other ops say which in ``inplace``.
        A kernel must read element i of a shared input before it writes element i of the output.
        """
        if self.view:
            return i == 0
        return self.elementwise or (self.inplace is not None and self.inplace(attrs, i))

    def shares_value(self, attrs: Attrs, inputs: Sequence[str], name: str) -> bool:
        """:meth:`shares` for the value ``name``, read at every input that names it: each must allow it (a
        fused conv whose residual is its own input may share the residual's bytes, not its input's)."""
        return all(self.shares(attrs, i) for i, other in enumerate(inputs) if other == name)

    def operand_offsets(self, attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> tuple[int, ...] | None:
        """Where each operand's bytes start in the output when the output is the operands end to end
        (``joins``, for these static types), else None."""
        if self.joins is None or any(t.bounded or not t.is_static for t in (*ins, out)) or not self.joins(attrs, ins, out):
            return None
        offsets, at = [], 0
        for t in ins:
            offsets.append(at)
            at += t.nbytes()
        return tuple(offsets) if at == out.nbytes() else None

    def normalize_attrs(self, given: Mapping[str, Any]) -> dict[str, AttrValue]:
        """Fill defaults and coerce to canonical Python types; reject unknown or missing attrs."""
        unknown = sorted(set(given) - set(self.attrs))
        if unknown:
            raise VerifyError(f"{self.name}: unknown attribute(s) {', '.join(unknown)}")
        out: dict[str, AttrValue] = {}
        for key, spec in sorted(self.attrs.items()):
            if key in given:
                out[key] = coerce_attr(self.name, key, spec.kind, given[key])
            elif spec.default is REQUIRED:
                raise VerifyError(f"{self.name}: missing required attribute {key!r}")
            else:
                out[key] = coerce_attr(self.name, key, spec.kind, spec.default)
        return out

    def check_arity(self, n_inputs: int) -> None:
        hi = self.max_inputs
        if n_inputs < self.min_inputs or (hi is not None and n_inputs > hi):
            want = f"{self.min_inputs}" + ("+" if hi is None else (f"..{hi}" if hi != self.min_inputs else ""))
            raise VerifyError(f"{self.name} takes {want} inputs, got {n_inputs}")


_INT64 = (-(1 << 63), (1 << 63) - 1)  # what an ONNX attribute's integer can hold


def _int64(v: Any) -> bool:
    """A whole number (no bool) that fits 64 bits (a float equal to one, ``2.0``, too)."""
    return not isinstance(v, (bool, np.bool_)) and int(v) == v and _INT64[0] <= int(v) <= _INT64[1]


def _shown(value: Any) -> str:
    """``value`` for an error message: at most 80 characters, and an integer past Python's 4,300 digits too
    (its repr raises ValueError)."""
    try:
        text = repr(value)
    except ValueError:
        return "an integer too long to print"
    return text if len(text) <= 80 else text[:77] + "..."


def coerce_attr(op: str, key: str, kind: AttrKind, value: Any) -> AttrValue:
    try:
        if kind is AttrKind.INT:
            if not _int64(value):
                raise TypeError
            return int(value)
        if kind is AttrKind.FLOAT:
            return float(value)
        if kind is AttrKind.STRING:
            if not isinstance(value, str):
                raise TypeError
            return value
        if kind is AttrKind.INTS:
            vals = tuple(value)
            if not all(_int64(v) and not isinstance(v, float) for v in vals):
                raise TypeError
            return tuple(int(v) for v in vals)
        if kind is AttrKind.FLOATS:
            return tuple(float(v) for v in value)
        if kind is AttrKind.DTYPE:
            return value if isinstance(value, DType) else DType(str(value))
    except (TypeError, ValueError, OverflowError):  # int(inf), float(10 ** 400)
        pass
    raise VerifyError(f"{op}: attribute {key!r} must be {kind.value}" + (" (64-bit)" if kind in (AttrKind.INT, AttrKind.INTS)
                                                                      else "") + f", got {_shown(value)}")


_TABLE: dict[str, OpDef] = {}
OP_TABLE: Mapping[str, OpDef] = MappingProxyType(_TABLE)


def register(*defs: OpDef) -> None:
    for d in defs:
        if d.name in _TABLE:
            raise RuntimeError(f"op {d.name} registered twice")
        _TABLE[d.name] = d


def get_op(name: str) -> OpDef:
    try:
        return OP_TABLE[name]
    except KeyError:
        raise VerifyError(f"unknown op {name!r}") from None


def require(cond: bool, message: str) -> None:
    """Shape-rule helper: reject operands with a ShapeError."""
    if not cond:
        raise ShapeError(message)
