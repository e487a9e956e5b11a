"""Element types of Cuvil IR and their NumPy equivalents."""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.Enum):
    """An element type; the value is its short name in the text form."""

    F32 = "f32"
    F64 = "f64"
    F16 = "f16"
    I8 = "i8"
    U8 = "u8"
    I16 = "i16"
    U16 = "u16"
    I32 = "i32"
    U32 = "u32"
    I64 = "i64"
    U64 = "u64"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(_TO_NUMPY[self])

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F64, DType.F16)

    @property
    def is_unsigned(self) -> bool:
        """Unsigned integers (bool counts: it is stored as a byte holding 0 or 1)."""
        return self.numpy.kind in "ub"

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        key = np.dtype(dtype).str.lstrip("<>=|")
        try:
            return _FROM_NUMPY[key]
        except KeyError:
            from ..errors import ShapeError

            raise ShapeError(f"dtype {np.dtype(dtype)} is not supported by Cuvil IR") from None

    @classmethod
    def parse(cls, text: str) -> DType:
        try:
            return cls(text)
        except ValueError:
            from ..errors import ParseError

            raise ParseError(f"unknown dtype {text!r}") from None


_TO_NUMPY = {
    DType.F32: "float32",
    DType.F64: "float64",
    DType.F16: "float16",
    DType.I8: "int8",
    DType.U8: "uint8",
    DType.I16: "int16",
    DType.U16: "uint16",
    DType.I32: "int32",
    DType.U32: "uint32",
    DType.I64: "int64",
    DType.U64: "uint64",
    DType.BOOL: "bool",
}
_FROM_NUMPY = {np.dtype(v).str.lstrip("<>=|"): k for k, v in _TO_NUMPY.items()}
