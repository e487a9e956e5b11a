"""A cryptographic random source for DP noise: ChaCha20 keyed with fresh OS randomness per release.

Never numpy's or torch's global generator, and never a key derived from anything stored: a copy of
the device's files must not let anyone recompute a past release's noise. Idempotency comes from the
stored noisy reply (:mod:`.release`). Tests may key one explicitly to be reproducible.
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

_BLOCK = 4096


class ChaChaRandom:
    """Uniform integers from a ChaCha20 keystream (key 32 bytes)."""

    def __init__(self, key: bytes, nonce: bytes = b"\0" * 16):
        if len(key) != 32:
            raise ValueError("ChaCha20 key must be 32 bytes")
        self._enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        self._buf = b""

    @classmethod
    def fresh(cls) -> ChaChaRandom:
        return cls(os.urandom(32))

    def _bytes(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._buf += self._enc.update(b"\0" * _BLOCK)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def randbelow(self, n: int) -> int:
        """Uniform in [0, n), by rejection: exact, no modulo bias."""
        if n <= 0:
            raise ValueError("randbelow needs n > 0")
        bits = (n - 1).bit_length()
        nbytes = max(1, (bits + 7) // 8)
        mask = (1 << bits) - 1
        while True:
            r = int.from_bytes(self._bytes(nbytes), "little") & mask
            if r < n:
                return r
