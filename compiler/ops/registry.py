"""The op table: every op defines, in one entry, its attributes, shape rule, checks and reference.

Adding an op means adding one :class:`OpDef` to one family module (``elementwise``, ``nn``, ...).
Shape rules and references see static shapes only (see ``ir.infer`` for the batch symbol).
"""

from __future__ import annotations

import enum
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


@dataclass(frozen=True)
class OpDef:
    """One op: ``infer`` is the shape rule (it also raises ShapeError on operands it rejects)."""

    name: str
    infer: ShapeRule
    reference: Reference
    attrs: Mapping[str, AttrSpec] = field(default_factory=dict)
    min_inputs: int = 1
    max_inputs: int | None = 1  # None: variadic
    doc: str = ""

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


def coerce_attr(op: str, key: str, kind: AttrKind, value: Any) -> AttrValue:
    try:
        if kind is AttrKind.INT:
            if isinstance(value, (bool, np.bool_)) or int(value) != value:
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
            if any(isinstance(v, (bool, float)) or int(v) != v for v in vals):
                raise TypeError
            return tuple(int(v) for v in vals)
        if kind is AttrKind.FLOATS:
            return tuple(float(v) for v in value)
        if kind is AttrKind.DTYPE:
            return value if isinstance(value, DType) else DType(str(value))
    except (TypeError, ValueError):
        pass
    raise VerifyError(f"{op}: attribute {key!r} must be {kind.value}, got {value!r}")


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
