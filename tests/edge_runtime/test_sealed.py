"""Sealed files: only the device secret and the right name open them; every byte is covered."""

from __future__ import annotations

import stat

import numpy as np
import pytest
from cuvil.edge_runtime.sealed import PAGE, Sealer, SealError

SECRET = bytes(range(32))


def _write(tmp_path, tail=b"w" * 5000, name="key-a"):
    path = tmp_path / "f.sealed"
    Sealer(SECRET).write(path, name, b'{"m":1}', [b"one", b"two!"], tail)
    return path


def test_round_trip_maps_the_tail_aligned_and_read_only(tmp_path):
    path = _write(tmp_path)
    got = Sealer(SECRET).read(path, "key-a")
    assert (got.meta, got.body) == (b'{"m":1}', b"onetwo!")
    assert got.tail.tobytes() == b"w" * 5000 and not got.tail.flags.writeable and got.tail.ctypes.data % PAGE == 0
    assert path.stat().st_size % PAGE == 0 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(Sealer(SECRET).read(_write(tmp_path, tail=b""), "key-a").tail) == 0


def test_another_secret_or_name_does_not_open_it(tmp_path):
    path = _write(tmp_path)
    with pytest.raises(SealError, match="MAC"):
        Sealer(bytes(32)).read(path, "key-a")
    with pytest.raises(SealError, match="MAC"):
        Sealer(SECRET).read(path, "key-b")


def test_every_byte_is_covered(tmp_path):
    """Flip each byte of the header, meta and body, and bytes across the tail: every flip is refused."""
    path = _write(tmp_path)
    raw = path.read_bytes()
    tail_start = len(raw) - 2 * PAGE
    where = list(range(tail_start)) + list(range(tail_start, len(raw), 97))
    head_and_body = 11 + 32 + 16 + 32 + 16 + 7 + 7
    for i in where:
        if head_and_body <= i < tail_start:
            continue  # zero padding between body and tail: never read
        bad = bytearray(raw)
        bad[i] ^= 0x01
        path.write_bytes(bytes(bad))
        with pytest.raises(SealError):
            Sealer(SECRET).read(path, "key-a")


def test_two_writes_of_the_same_content_differ(tmp_path):
    """A fresh nonce per write, so the tail's one-time key is never used for two messages."""
    a = _write(tmp_path).read_bytes()
    b = _write(tmp_path).read_bytes()
    assert a != b and len(a) == len(b)


def test_garbage_and_lengths_out_of_bounds(tmp_path):
    path = tmp_path / "g"
    for content in (b"", b"CUVILSEAL1\n", np.random.default_rng(1).bytes(3 * PAGE),
                    b"CUVILSEAL1\n" + b"\xff" * 200):
        path.write_bytes(content)
        with pytest.raises(SealError):
            Sealer(SECRET).read(path, "x")
