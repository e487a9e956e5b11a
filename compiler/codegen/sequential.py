"""Ops whose result has a bounded length (``TensorType.bounded_axis``): each is one sequential body
over the whole op that writes the result's elements, then its valid length. The CPU kernel runs it
as it is, the NVPTX kernel on a single thread (these ops are small and serial)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from llvmlite import ir

from ..ir.types import TensorType
from .nms import non_max_suppression
from .nonzero import non_zero

Body = Callable[[ir.IRBuilder, Mapping, Sequence[TensorType], Sequence[TensorType], Sequence[ir.Value], ir.Value], None]
"""(builder, attributes, input types, output types, input pointers, output pointer) -> None."""

SEQUENTIAL: Mapping[str, Body] = {"NonMaxSuppression": non_max_suppression, "NonZero": non_zero}
