"""Sealed cache files: what a device wrote, bound by a MAC to the name (cache key) it wrote it under.

A compile cache holds code this process will execute, so an entry is trusted only if it carries a
MAC under the device secret (:func:`cuvil.edge_runtime.private.device_secret`) over its name and
its bytes. Without the secret nobody can write an entry this device accepts, and an entry copied
to another key's name fails, since the name is MAC'd too. Layout (little endian)::

    fixed header: MAGIC | mac (32) | nonce (16) | meta length | body length | tail offset | tail length | tail tag (16)
                  | tail MAC algorithm (1)
    meta | body | zero pad to a page | tail | zero pad to a page

``mac`` is HMAC-SHA256 over the name and everything in the header after it, the meta and the body,
all read into private memory first, so what was checked is what is used. The tail (packed weights,
megabytes, mapped straight from the file) carries a tag under a one-time key derived from the
secret, the name and a fresh random nonce, by the fastest one-time MAC of the writing CPU
(:data:`TAIL_MACS`; HMAC-SHA256 would cost ~30 ms per 44 MB on a warm start): GMAC where the CPU
multiplies carry-less (x86 PCLMUL, Arm PMULL: ~3 ms for ResNet-18's 57 MB on one Zen 4 core, in
chunks that several cores check at once), else Poly1305 (~5 ms there, and far faster than
table-driven GHASH on a core without those instructions). The tag and the algorithm's number are in
the header, so the MAC covers both; the pad after the tail must be zero. The mapped tail could
still be changed after the check by whoever can write the file: the reader accepts only files of
this user that no one else may write, and that user can change the process anyway.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.poly1305 import Poly1305

from .cpu_share import cores, runnable_now
from ..compiler.digest import HmacSha256, equal, hmac_sha256, sha256
from ..compiler.regular_file import open_regular, read_exactly

MAGIC = b"CUVILSEAL2\n"
PAGE = 4096
_FIXED = struct.Struct(f"<{len(MAGIC)}s32s16sQQQQ16sB")
_AFTER_MAC = len(MAGIC) + 32
MAX_META_BYTES = 64 << 20
MAX_BODY_BYTES = 1 << 30


class SealError(ValueError):
    """The file is truncated, garbled, of another format, or fails its MAC: the caller treats it as a miss."""


@dataclass(frozen=True)
class Unsealed:
    meta: bytes
    body: bytes
    tail: np.ndarray  # uint8, read-only, page-aligned (a view of a mapping of the file)


class Tagger:
    """A tail's tag worked out in pieces (GMAC's chunks) that any thread may take, each piece's MAC
    call releasing the GIL: a check that began on threads of their own is joined by the caller when it
    asks for the result, rather than waited for (those threads need the GIL between pieces, and the
    caller's Python work holds it)."""

    def __init__(self, pieces: int, piece: Callable[[int], bytes], combine: Callable[[list[bytes]], bytes]):
        self._piece, self._combine = piece, combine
        self._tags = [b""] * pieces
        self._claims = itertools.count()  # next() is atomic: each piece is taken once
        self._error: Exception | None = None

    def work(self) -> None:
        """Tag the pieces no thread has taken, until none is left (a failed piece's tag stays empty)."""
        try:
            for i in self._claims:
                if i >= len(self._tags):
                    return
                self._tags[i] = self._piece(i)
        except Exception as e:  # noqa: BLE001 - any failure is a refusal, raised by tag()
            self._error = self._error or e

    def tag(self) -> bytes:
        """The tag, once every thread that worked on it has returned."""
        if self._error is not None:
            raise self._error
        return self._combine(self._tags)


def tag_on(tagger: Tagger, helpers: int) -> bytes:
    """``tagger``'s tag, worked out by the calling thread and ``helpers`` threads beside it."""
    threads = [threading.Thread(target=tagger.work, daemon=True) for _ in range(helpers)]
    for t in threads:
        t.start()
    tagger.work()
    for t in threads:
        t.join()
    return tagger.tag()


class TailCheck:
    """The check of a sealed file's tail. A big tail's starts on ``helpers`` threads when the file is
    opened, so the caller prepares what does not need the tail meanwhile (a warm start loads the
    code), and joins in when it asks for the :meth:`result`; any other starts in :meth:`result`, on the
    caller's thread and the helpers, once that work is done (a 57 MB check streamed through the caches
    first made a warm start's next Python work 1 ms slower). ``finish`` compares the tag and returns
    the tail."""

    def __init__(self, tagger: Tagger, finish: Callable[[], np.ndarray], helpers: int, early: bool):
        self._tagger, self._finish, self._tail, self._error = tagger, finish, None, None
        self.helpers, self.early = helpers, early
        self._threads = [threading.Thread(target=tagger.work, daemon=True) for _ in range(helpers)]
        self._started = self._done = False
        if early:
            self._start()

    def _start(self) -> None:
        for t in self._threads:
            t.start()
        self._started = True

    def result(self) -> np.ndarray:
        """The checked tail (uint8, read-only, page-aligned); SealError when it fails its check."""
        if not self._done:
            if not self._started:
                self._start()
            self._tagger.work()
            for t in self._threads:
                t.join()
            try:
                self._tail = self._finish()
            except Exception as e:  # noqa: BLE001 - any failure is a refusal
                self._error = e
            self._done = True
        if self._tail is None:
            e = self._error
            raise e if isinstance(e, SealError) else SealError(f"the tail could not be checked: {type(e).__name__}")
        return self._tail


@dataclass(frozen=True)
class Opened:
    """A sealed file whose head, meta and body are checked, and whose tail is being checked."""

    meta: bytes
    body: bytes
    tail: TailCheck
    stat: os.stat_result | None = None  # the file's, as it was opened: a reader needs no second stat


def _page_up(n: int) -> int:
    return n + (-n % PAGE)


BACKGROUND_CHECK_BYTES = 1 << 20
"""A tail this long or longer is checked on helper threads from the moment its file is opened, while
the caller goes on (a thread costs ~0.1 ms to start; a MiB of MAC, and the cipher's first set-up, more)."""
GMAC_CHUNK = 4 << 20
"""GMAC tags the tail in chunks this long (part of the format): AESGCM releases the GIL, so the
chunks of a warm start's weights are checked on several cores at once."""
MAX_CHECK_THREADS = 4  # beyond that, memory bandwidth bounds the check, not the cores


def _poly1305(key: bytes, data: memoryview) -> Tagger:
    return Tagger(1, lambda i: Poly1305.generate_tag(key, data), lambda tags: tags[0])


def tail_check_threads() -> int:
    """Threads that check a tail: the cores this process may run on that nothing else runs on now
    (:func:`runnable_now`, this thread counted as one of them), at most MAX_CHECK_THREADS; 1 on a busy
    machine, where more threads only queue for a core and the caller's wait for them queues again (2
    CPUs at load 11: a ResNet-18 warm start 10 ms slower in wall time with 2 threads and the check
    beside the code load than with neither). A check on a thread of its own takes one fewer: the caller
    goes on working beside it (2 idle CPUs: a ResNet-18 warm start 15.6-17.8 -> 13.6-14.5 ms with one
    AES thread instead of two beside the caller)."""
    n = cores()
    return max(1, min(n, MAX_CHECK_THREADS, int(n - runnable_now() + 1)))


def _gmac(key: bytes, data: memoryview) -> Tagger:
    """GMAC (AES-256-GCM over no plaintext, the data as associated data) of each GMAC_CHUNK under the
    one-time key, the chunk's number as its nonce, chunk by chunk on whichever threads work on it; one
    chunk's tag as it is, more chunks' hashed in order."""
    starts = range(0, max(len(data), 1), GMAC_CHUNK)

    def piece(i: int) -> bytes:
        return AESGCM(key).encrypt(i.to_bytes(12, "little"), b"", data[starts[i]:starts[i] + GMAC_CHUNK])

    return Tagger(len(starts), piece,
                  lambda tags: tags[0] if len(tags) == 1 else sha256(b"".join(tags)).digest()[:16])


TAIL_MACS = {1: _poly1305, 2: _gmac}
"""A sealed file's tail MAC by the number its header records: (one-time 32-byte key, data) -> the
:class:`Tagger` of its 16-byte tag."""
POLY1305, GMAC = 1, 2
CARRY_LESS_MULTIPLY = {"x86_64": ("aes", "pclmul"), "aarch64": ("aes",)}
"""Per architecture, the LLVM host features under which GMAC runs in hardware (Arm's ``aes`` includes PMULL)."""


def preferred_tail_mac() -> int:
    """GMAC where this CPU has AES and carry-less multiplication, else Poly1305."""
    from ..devices import host_profile

    host = host_profile()
    need = CARRY_LESS_MULTIPLY.get(host.triple.split("-")[0])
    return GMAC if need and all(f"+{f}" in host.features for f in need) else POLY1305


class Sealer:
    """Seals and opens files under keys derived from one device secret."""

    def __init__(self, secret: bytes, tail_mac: int | None = None):
        """``tail_mac``: what :meth:`write` tags tails with (default :func:`preferred_tail_mac`, asked on
        the first write); :meth:`read` takes whichever the file records."""
        self._mac_key = hmac_sha256(secret, b"cuvil sealed file: mac")
        self._tail_key = hmac_sha256(secret, b"cuvil sealed file: tail")
        self._tail_mac = tail_mac

    def _mac(self, name: str, header_rest: bytes, meta_and_body: bytes | list[bytes]) -> bytes:
        h = HmacSha256(self._mac_key)
        label = name.encode()
        h.update(len(label).to_bytes(8, "little") + label + header_rest)
        for part in [meta_and_body] if isinstance(meta_and_body, bytes) else meta_and_body:
            h.update(part)
        return h.digest()

    def _tagger(self, algorithm: int, name: str, nonce: bytes, tail: memoryview) -> Tagger:
        return TAIL_MACS[algorithm](hmac_sha256(self._tail_key, name.encode() + b"\0" + nonce), tail)

    def write(self, path: str | os.PathLike, name: str, meta: bytes, body: list[bytes], tail) -> None:
        """Write a sealed file and publish it at ``path`` with one atomic ``os.replace``; ``tail`` is any
        bytes-like object (a packed weight block: never copied)."""
        path = Path(path)
        body_len = sum(map(len, body))
        if len(meta) > MAX_META_BYTES or body_len > MAX_BODY_BYTES:
            raise SealError(f"{len(meta)} bytes of metadata and {body_len} of body are more than a sealed file holds")
        tail_off = _page_up(_FIXED.size + len(meta) + body_len)
        tail = memoryview(tail).cast("B")
        pad = bytes(_page_up(len(tail)) - len(tail))
        nonce = os.urandom(16)
        if self._tail_mac is None:
            self._tail_mac = preferred_tail_mac()
        tag = tag_on(self._tagger(self._tail_mac, name, nonce, tail), tail_check_threads() - 1)
        rest = _FIXED.pack(MAGIC, bytes(32), nonce, len(meta), body_len, tail_off, len(tail), tag,
                           self._tail_mac)[_AFTER_MAC:]
        mac = self._mac(name, rest, [meta, *body])
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:16]}.", suffix=".tmp", dir=path.parent)  # O_EXCL, 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + mac + rest + meta)
                for part in body:
                    f.write(part)
                f.write(bytes(tail_off - f.tell()))
                f.write(tail)
                f.write(pad)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def read(self, path: str | os.PathLike, name: str) -> Unsealed:
        """Open, bound-check and authenticate ``path`` as the file sealed under ``name``, tail included.

        Raises SealError for a file that is not a good sealed file of that name, OSError for a
        path that is missing or not a regular file of this user; never blocks, never parses
        anything before the MAC holds.
        """
        opened = self.open(path, name)
        return Unsealed(opened.meta, opened.body, opened.tail.result())

    def open(self, path: str | os.PathLike, name: str) -> Opened:
        """:meth:`read`, except that the tail's check may be under way when it returns (on a thread when
        the tail is BACKGROUND_CHECK_BYTES or more and a core is idle): nothing may read the tail before
        ``tail.result()``."""
        fd, st = open_regular(path, owned=True)
        try:
            head = read_exactly(fd, _FIXED.size)
            if len(head) != _FIXED.size or not head.startswith(MAGIC):
                raise SealError("not a sealed cuvil file")
            _, mac, nonce, meta_len, body_len, tail_off, tail_len, tag, algorithm = _FIXED.unpack(head)
            if meta_len > MAX_META_BYTES or body_len > MAX_BODY_BYTES:
                raise SealError("metadata or body length out of bounds")
            if tail_off != _page_up(_FIXED.size + meta_len + body_len) or tail_off + _page_up(tail_len) != st.st_size:
                raise SealError(f"size mismatch: the file has {st.st_size} bytes")
            data = read_exactly(fd, meta_len + body_len)
            if len(data) != meta_len + body_len:
                raise SealError("truncated")
            if not equal(mac, self._mac(name, head[_AFTER_MAC:], data)):
                raise SealError("MAC mismatch: not written by this device under this key")
            if algorithm not in TAIL_MACS:
                raise SealError(f"unknown tail MAC {algorithm}")
            region = mmap.mmap(fd, _page_up(tail_len), access=mmap.ACCESS_READ, offset=tail_off) if tail_len else b""
        finally:
            os.close(fd)

        free = tail_check_threads() if tail_len else 1  # a tail-less memo asks nothing of /proc on a warm start
        early = tail_len >= BACKGROUND_CHECK_BYTES and free > 1  # beside the caller's work: it keeps its core
        view = memoryview(region)
        # nothing to check (the fingerprint's memo): no cipher set up on a warm start's path
        tagger = self._tagger(algorithm, name, nonce, view[:tail_len]) if tail_len else Tagger(0, bytes, lambda t: b"")

        def finish() -> np.ndarray:
            if not tail_len:
                return np.zeros(0, dtype=np.uint8)
            if view[tail_len:] != bytes(len(view) - tail_len):
                raise SealError("the tail's pad is not zero")
            if not equal(tag, tagger.tag()):
                raise SealError("tail MAC mismatch")
            return np.frombuffer(region, dtype=np.uint8)[:tail_len]

        return Opened(data[:meta_len], data[meta_len:], TailCheck(tagger, finish, free - 1, early), st)
