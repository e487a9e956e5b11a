"""An .npy header is checked against the bytes that follow it before they are read."""

from __future__ import annotations

import io

import numpy as np
import pytest

from cuvil.compiler.npy_header import read_header


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def test_a_plain_array_reads_its_header_and_stops_at_its_data():
    data = _npy(np.arange(6, dtype=np.int16).reshape(2, 3))
    f = io.BytesIO(data)
    assert read_header(f, len(data), "x") == ((2, 3), False, np.dtype("<i2"))
    assert data[f.tell():] == np.arange(6, dtype=np.int16).tobytes()


@pytest.mark.parametrize("data, words", [
    (_npy(np.zeros(4, np.float32))[:-1], "declares 16 bytes of data and holds 15"),
    (_npy(np.zeros(4, np.float32)) + b"\0", "declares 16 bytes of data and holds 17"),
    (_npy(np.array([{"a": 1}], dtype=object)), "Python objects"),
    (b"PK\x03\x04 not an npy", "not an .npy"),
    (b"\x93NUMPY\x09\x00", "not an .npy"),  # a format version np.save never writes
])
def test_a_header_that_does_not_fit_its_bytes_is_refused(data, words):
    with pytest.raises(ValueError, match=words):
        read_header(io.BytesIO(data), len(data), "x")
