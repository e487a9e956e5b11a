"""SHA-256, HMAC-SHA-256 and a timing-safe MAC comparison from ``cryptography``, which every device process
loads anyway (bundle signatures, sealed files).

Why not :mod:`hashlib` and :mod:`hmac`: importing either maps a second OpenSSL, the system's libcrypto, 3.8 MiB
more resident in every device process (Zen 4, 2026-12-08: NumPy and ``cryptography`` loaded, then ``hashlib``),
where ONNX Runtime's process maps none and a small model's whole process is 55-60 MiB. Same digests, same speed
on big inputs (SHA-256 of 50 MB: 30.5 against 29.5 ms); ~2 us a small one. Nothing a device imports uses the
standard library's (``tests/compiler/test_digest.py`` checks a device's imports).
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import hashes, hmac


def _buffer(data):
    """``data`` as ``cryptography`` takes it: bytes as they are, any other buffer (a NumPy array, a memoryview
    of floats) as its bytes, which must be C-contiguous (TypeError where ``hashlib`` raises ValueError)."""
    if isinstance(data, (bytes, bytearray)):
        return data
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 and view.c_contiguous else view.cast("B")


class Sha256:
    """An incremental SHA-256 with ``hashlib``'s methods: ``update``, and ``digest`` / ``hexdigest`` any number
    of times."""

    __slots__ = ("_h",)

    def __init__(self, data=b"") -> None:
        self._h = hashes.Hash(hashes.SHA256())
        self._h.update(_buffer(data))

    def update(self, data) -> None:
        """Add ``data``: bytes or any C-contiguous buffer (a memoryview, a NumPy array); TypeError else."""
        self._h.update(_buffer(data))

    def digest(self) -> bytes:
        return self._h.copy().finalize()

    def hexdigest(self) -> str:
        return self.digest().hex()


def sha256(data=b"") -> Sha256:
    return Sha256(data)


def short_hex(text: str, chars: int) -> str:
    """The first ``chars`` hex digits of ``text``'s SHA-256: a stable short name for a symbol or file."""
    return Sha256(text.encode()).hexdigest()[:chars]


class HmacSha256:
    """An incremental HMAC-SHA-256 (``update``, then ``digest`` once)."""

    __slots__ = ("_h",)

    def __init__(self, key: bytes, data=b"") -> None:
        self._h = hmac.HMAC(key, hashes.SHA256())
        self._h.update(_buffer(data))

    def update(self, data) -> None:
        self._h.update(_buffer(data))

    def digest(self) -> bytes:
        return self._h.finalize()


def hmac_sha256(key: bytes, data) -> bytes:
    return HmacSha256(key, data).digest()


_EQUAL_KEY = os.urandom(32)


def equal(a: bytes | str, b: bytes | str) -> bool:
    """Whether two MACs or tags are equal, in time independent of where they differ: each is MACed under a key
    of this process and the MACs compared, so a mismatch's position tells nothing (``cryptography``'s
    ``constant_time`` imports :mod:`hmac`). Text compares as UTF-8: a hostile file's non-ASCII text is a
    mismatch, where ``hmac.compare_digest`` raised TypeError."""
    a, b = (v.encode() if isinstance(v, str) else memoryview(v).tobytes() for v in (a, b))  # an int: TypeError
    return hmac_sha256(_EQUAL_KEY, a) == hmac_sha256(_EQUAL_KEY, b)
