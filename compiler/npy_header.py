"""An .npy array's header, checked against the bytes that follow it before any of them is read.

NumPy's reader believes the header: a 100-byte file that declares 2^40 floats is allocated first
and found short after. Every .npy that Cuvil takes from elsewhere (a user's input file, an array a
device or the coordinator sent) is read through :func:`read_header` instead.
"""

from __future__ import annotations

import math
from typing import BinaryIO

import numpy as np
import numpy.lib.format as npy_format

HEADER_READERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
"""The .npy formats np.save writes for plain dtypes."""
HEADER_ERRORS = (KeyError, ValueError, TypeError, EOFError, OSError, RecursionError)
"""What reading a malformed header raises (an unknown format version: KeyError)."""


def read_header(f: BinaryIO, size: int, what: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of the .npy that ``f`` is at the start of, ``size`` bytes in all,
    leaving ``f`` at its data: ValueError unless it is format 1.0 or 2.0 of a dtype without Python
    objects, and exactly the bytes its header declares follow the header."""
    try:
        shape, fortran, dtype = HEADER_READERS[npy_format.read_magic(f)](f)
    except HEADER_ERRORS:
        raise ValueError(f"{what} is not an .npy array file (format 1.0 or 2.0)") from None
    if dtype.hasobject:
        raise ValueError(f"{what} holds Python objects: not an .npy array file")
    declared, held = math.prod(shape) * dtype.itemsize, size - f.tell()
    if declared != held:
        raise ValueError(f"{what} declares {declared} bytes of data and holds {held}")
    return shape, fortran, dtype
