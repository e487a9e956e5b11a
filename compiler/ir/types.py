"""Tensor types: static dimensions plus one symbolic batch dimension ``N``, and bounded lengths.

A *bounded* type (``i64[<=12,3]``, ``i64[2,<=6]``: an op whose length along one axis depends on the
data, NonMaxSuppression, NonZero) has one dimension, ``bounded_axis``, that is an upper bound: its
bytes hold the whole bound, then (at the next multiple of 8 bytes) one int64, the valid length
along that axis, which the op writes. The arena reserves the bound; a runtime hands out the valid
part only.

A dimension is either an ``int`` or a :class:`Batch` (``k*N``). Shape rules never see the symbol:
:func:`cuvil.compiler.ir.infer.infer_node` evaluates them at two probe batch sizes and maps the
results back, so every rule is written over plain integers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import ParseError
from .dtypes import DType


@dataclass(frozen=True, order=True)
class Batch:
    """The symbolic batch dimension, times a positive integer factor (``N``, ``2N``...)."""

    factor: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.factor, bool) or not isinstance(self.factor, int) or self.factor < 1:
            raise ValueError(f"batch factor must be a positive integer, got {self.factor!r}")

    def __str__(self) -> str:
        return "N" if self.factor == 1 else f"{self.factor}N"

    def bind(self, batch: int) -> int:
        return self.factor * batch


Dim = int | Batch
N = Batch(1)
_DIM_RE = re.compile(r"^(?:(\d+)|(\d*)N)$")


def parse_dim(text: str) -> Dim:
    m = _DIM_RE.match(text.strip())
    if not m:
        raise ParseError(f"bad dimension {text!r}")
    if m.group(1) is not None:
        return int(m.group(1))
    return Batch(int(m.group(2)) if m.group(2) else 1)


COUNT_BYTES = 8
"""A bounded value's valid length: one little-endian int64 after its elements."""


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...]
    bounded_axis: int | None = None  # this dimension is an upper bound; the valid length follows the elements

    def __post_init__(self) -> None:
        for d in self.shape:
            if isinstance(d, bool) or not isinstance(d, (int, Batch)) or (isinstance(d, int) and d < 0):
                raise ValueError(f"bad dimension {d!r} in shape {self.shape!r}")
        axis = self.bounded_axis
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(self.shape)):
            raise ValueError(f"bounded axis {axis!r} is not a dimension of {self.shape!r}")

    @property
    def bounded(self) -> bool:
        return self.bounded_axis is not None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def bind(self, batch: int) -> TensorType:
        """The same type with ``N`` replaced by a concrete batch size."""
        return TensorType(self.dtype, tuple(d.bind(batch) if isinstance(d, Batch) else d for d in self.shape),
                          self.bounded_axis)

    def numel(self, batch: int = 1) -> int:
        return math.prod(self.bind(batch).shape)

    def nbytes(self, batch: int = 1) -> int:
        """The value's bytes; a bounded value's include its valid length (see :meth:`count_offset`)."""
        rows = self.numel(batch) * self.dtype.itemsize
        return self.count_offset(batch) + COUNT_BYTES if self.bounded else rows

    def count_offset(self, batch: int = 1) -> int:
        """Where a bounded value's int64 valid length starts: after the elements, 8-byte aligned."""
        return -(-self.numel(batch) * self.dtype.itemsize // COUNT_BYTES) * COUNT_BYTES

    def __str__(self) -> str:
        dims = [str(d) for d in self.shape]
        if self.bounded_axis is not None:
            dims[self.bounded_axis] = "<=" + dims[self.bounded_axis]
        return f"{self.dtype.value}[{','.join(dims)}]"

    @classmethod
    def parse(cls, text: str) -> TensorType:
        m = re.match(r"^\s*(\w+)\[(.*)\]\s*$", text)
        if not m:
            raise ParseError(f"bad tensor type {text!r}")
        parts = [d.strip() for d in m.group(2).split(",")] if m.group(2).strip() else []
        marked = [k for k, d in enumerate(parts) if d.startswith("<=")]
        if len(marked) > 1:
            raise ParseError(f"bad tensor type {text!r}: more than one bounded dimension")
        dims = tuple(parse_dim(d.removeprefix("<=")) for d in parts)
        return cls(DType.parse(m.group(1)), dims, marked[0] if marked else None)

