"""The op table. Importing this package registers every op family."""

from . import bounded, elementwise, elementwise_math, fused, indexing, linalg, logic, nn, quant, reduce, resample, shape  # noqa: F401  (each module registers its ops)
from .registry import OP_TABLE, REQUIRED, AttrKind, AttrSpec, OpDef, get_op, register

__all__ = ["OP_TABLE", "REQUIRED", "AttrKind", "AttrSpec", "OpDef", "get_op", "register"]
