"""Ops that are one sequential body over the whole op: those whose result has a bounded length
(``TensorType.bounded_axis``: the body writes the result's elements, then its valid length), and
TopKIndices (an insertion per element). The CPU kernel runs it as it is, the NVPTX kernel on a
single thread (these ops are small and serial)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from llvmlite import ir

from ..ir.types import TensorType
from .nms import non_max_suppression
from .nonzero import non_zero
from .topk import top_k_indices

Body = Callable[[ir.IRBuilder, Mapping, Sequence[TensorType], Sequence[TensorType], Sequence[ir.Value], ir.Value], None]
"""(builder, attributes, input types, output types, input pointers, output pointer) -> None."""

SEQUENTIAL: Mapping[str, Body] = {"NonMaxSuppression": non_max_suppression, "NonZero": non_zero,
                                  "TopKIndices": top_k_indices}
