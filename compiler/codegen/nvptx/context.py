"""What a GPU op emitter sees (:class:`OpContext`) and returns (:class:`Loop`s over output shapes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from ...ir.types import TensorType
from .. import irhelpers as h

Body = Callable[[ir.IRBuilder, list[ir.Value], ir.Value], None]


@dataclass
class Loop:
    """One grid-stride loop over ``shape``: ``body(b, index per dimension, linear index)``."""

    shape: tuple[int, ...]
    body: Body


@dataclass
class OpContext:
    """What an op emitter sees: static types and attributes, typed pointer arguments."""

    b: ir.IRBuilder
    node_op: str
    attrs: dict
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]
    ins: list[ir.Value]
    outs: list[ir.Value]
    fault: ir.Value | None = None  # i32*, the fault word, for ops with OpDef.run_time_check

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.in_types[i].shape)  # type: ignore[arg-type]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.out_types[0].shape)  # type: ignore[arg-type]

    def load(self, i: int, index: ir.Value) -> ir.Value:
        return h.load(self.b, self.ins[i], index)
