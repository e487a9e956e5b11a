"""Element types of Cuvil IR and their NumPy equivalents.

The narrow types' NumPy dtypes come from ml_dtypes, imported when one is first asked for: a
device process running float32 code never loads it (~7 MB).
"""

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
    BF16 = "bf16"
    F8E4M3FN = "f8e4m3fn"
    F8E4M3FNUZ = "f8e4m3fnuz"
    F8E5M2 = "f8e5m2"
    F8E5M2FNUZ = "f8e5m2fnuz"
    F8E8M0 = "f8e8m0"
    F4E2M1 = "f4e2m1"
    I4 = "i4"
    U4 = "u4"
    I2 = "i2"
    U2 = "u2"

    @property
    def numpy(self) -> np.dtype:
        name = _TO_NUMPY[self]
        if self in NARROW:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        return np.dtype(name)

    @property
    def finfo(self):
        """The float type's limits (``np.finfo``'s fields; ml_dtypes' for the narrow floats, imported then)."""
        if self in NARROW:
            import ml_dtypes

            return ml_dtypes.finfo(self.numpy)
        return np.finfo(self.numpy)

    @property
    def itemsize(self) -> int:
        return _NARROW_ITEMSIZE.get(self) or self.numpy.itemsize

    @property
    def bits(self) -> int:
        """The width of one element's value (int4: 4, though held in a byte)."""
        return _SUB_BYTE.get(self, 8 * self.itemsize)

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F64, DType.F16)

    @property
    def is_narrow(self) -> bool:
        """A storage-only type (bfloat16, float8, float4, int4, int2): held one element per
        byte (bfloat16: two bytes), never computed in; Cast converts it to and from the others,
        and ops marked ``narrow_ok`` in the op table move its bytes."""
        return self in NARROW

    @property
    def is_unsigned(self) -> bool:
        """Unsigned integers (bool counts: it is stored as a byte holding 0 or 1)."""
        return self.numpy.kind in "ub"

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        key = np.dtype(dtype).name  # not ``.str``: every ml_dtypes type is 'V1' or 'V2' there
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
    DType.BF16: "bfloat16",  # the narrow types: ml_dtypes' names of them (and of their NumPy dtypes)
    DType.F8E4M3FN: "float8_e4m3fn",
    DType.F8E4M3FNUZ: "float8_e4m3fnuz",
    DType.F8E5M2: "float8_e5m2",
    DType.F8E5M2FNUZ: "float8_e5m2fnuz",
    DType.F8E8M0: "float8_e8m0fnu",
    DType.F4E2M1: "float4_e2m1fn",
    DType.I4: "int4",
    DType.U4: "uint4",
    DType.I2: "int2",
    DType.U2: "uint2",
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}
NARROW = frozenset({DType.BF16, DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ, DType.F8E8M0,
                    DType.F4E2M1,
                    DType.I4, DType.U4, DType.I2, DType.U2})
_NARROW_ITEMSIZE = {d: 2 if d is DType.BF16 else 1 for d in NARROW}
"""Bytes per element ml_dtypes holds each narrow type in, known without importing it."""
_SUB_BYTE = {DType.F4E2M1: 4, DType.I4: 4, DType.U4: 4, DType.I2: 2, DType.U2: 2}
SATURABLE = frozenset({DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ})
"""The types ONNX Cast's ``saturate`` attribute clamps to their largest finite value (f8e8m0 has its
own rule: a power of two, rounded by ``round_mode``, that ``saturate`` keeps below NaN)."""
E8M0_ROUNDING = ("up", "down", "nearest")


def clean_bools(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a`` with every bool the byte 0 or 1 (other arrays as they are; ``out``: a bool array's destination).
    NumPy takes any nonzero byte for True (a mask read with ``np.frombuffer(data, bool)``); native code reads
    the byte itself, and a 2 there cast to 2.0 and negated to 253. Where bools enter native code (a run's
    inputs), they pass here."""
    return np.not_equal(a.view(np.uint8), 0, out=out) if a.dtype == np.bool_ else a


def bool_bytes_clean(a: np.ndarray) -> bool:
    """Whether every byte of bool array ``a`` is 0 or 1 (true of any other array)."""
    return a.dtype != np.bool_ or not a.size or int(a.view(np.uint8).max()) <= 1
