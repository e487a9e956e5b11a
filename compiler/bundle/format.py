"""The `.cuvil` layout: header, canonical manifest, and the checks that parse them safely.

    [0, 72)      header      magic, format version, flags, manifest length, data offset,
                             file length, signer's raw Ed25519 public key (all little-endian)
    [72, 136)    signature   Ed25519 over header || manifest
    [136, ...)   manifest    canonical JSON (sorted keys, no spaces, ASCII), at most 64 MiB, stored
                             zlib-compressed when the header's flag DEFLATE is set
    zero padding up to data_offset (a multiple of 64)
    data region  weight segments at 64-aligned offsets (relative to data_offset), zero padded

Offsets in the manifest are relative to ``data_offset`` so the manifest never depends on its own
length. Every byte is covered: header and manifest by the signature, segments by their SHA-256
(listed in the manifest), padding by the rule that it must be zero. See docs/bundle-format.md.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..digest import sha256
from ..errors import BundleError
from ..ir.dtypes import DType
from .json_budget import JsonBudget, loads_bounded
from .lineage import Lineage
from .signing import PUBLIC_KEY_SIZE, SIGNATURE_SIZE
from .subbyte import packed_nbytes

MAGIC = b"\x89CUVIL\r\n"  # high bit and CRLF catch 7-bit and text-mode mangling, as PNG's does
FORMAT_VERSION = 1
ALIGN = 64
HEADER = struct.Struct("<8sIIQQQ32s")
SIGNATURE_OFFSET = HEADER.size
MANIFEST_OFFSET = HEADER.size + SIGNATURE_SIZE
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
DEFLATE = 1  # header flag: the manifest is stored zlib-compressed (a graph text is mostly names)
MAX_RANK = 32
_DTYPE_NAMES = frozenset(d.value for d in DType)  # built once: a set per weight cost ResNet-50's load ~1 ms
MAX_ELEMENTS = 1 << 48  # bound on the product of dimensions (zeros counted as one)
MAX_NAME_CHARS = 1024
_TOP_LEVEL = 64  # bound on the JSON items of a manifest outside its entry lists (top fields, lineage)
_HEX64 = re.compile(r"[0-9a-f]{64}")

assert HEADER.size == 40 + PUBLIC_KEY_SIZE


_HEX_DIGITS = frozenset("0123456789abcdef")


def is_sha256_hex(value: object) -> bool:
    """Is ``value`` a SHA-256 in lower-case hex, as content hashes and cache keys are written? The one
    check for a hash that came from outside (a device's report, a file name, a hint file)."""
    return isinstance(value, str) and len(value) == 64 and _HEX_DIGITS.issuperset(value)


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Header:
    """The fixed-size, signed prefix. Parsing it needs no trust: it is only sizes and a key id."""

    manifest_length: int
    data_offset: int
    file_length: int
    signer_key: bytes
    version: int = FORMAT_VERSION
    flags: int = 0
    magic: bytes = MAGIC  # a signed delta (:mod:`.delta`) has the same header under its own magic

    def pack(self) -> bytes:
        return HEADER.pack(self.magic, self.version, self.flags, self.manifest_length, self.data_offset,
                           self.file_length, self.signer_key)

    @classmethod
    def unpack(cls, buf: Any, file_size: int, magic: bytes = MAGIC, what: str = "bundle") -> Header:
        """Read the header from ``buf``; check only what locating the signed bytes needs."""
        if file_size < MANIFEST_OFFSET:
            raise BundleError(f"file is too short to be a Cuvil {what} ({file_size} bytes)")
        if len(buf) < HEADER.size:
            raise BundleError(f"{what} is truncated inside its header ({len(buf)} bytes read)")
        found, version, flags, mlen, data_offset, file_length, key = HEADER.unpack_from(buf, 0)
        if found != magic:
            raise BundleError(f"not a Cuvil {what} (bad magic bytes)")
        if version != FORMAT_VERSION:
            raise BundleError(f"unsupported bundle format version {version} (this Cuvil reads {FORMAT_VERSION})")
        if not 2 <= mlen <= MAX_MANIFEST_BYTES:
            raise BundleError(f"manifest length {mlen} is out of bounds")
        if MANIFEST_OFFSET + mlen > file_size:
            raise BundleError(f"bundle is truncated: the manifest ends past the end of the file ({file_size} bytes)")
        return cls(mlen, data_offset, file_length, bytes(key), version, flags, magic)

    def check_layout(self, file_size: int) -> None:
        """After the signature holds: the signed sizes must describe exactly this file."""
        if self.flags & ~DEFLATE:
            raise BundleError(f"unknown header flags {self.flags:#x}")
        if self.data_offset != align(MANIFEST_OFFSET + self.manifest_length):
            raise BundleError(f"data offset {self.data_offset} does not follow the manifest")
        if self.file_length < self.data_offset:
            raise BundleError(f"file length {self.file_length} is smaller than the data offset")
        if file_size < self.file_length:
            raise BundleError(f"bundle is truncated: {file_size} bytes, the header says {self.file_length}")
        if file_size > self.file_length:
            raise BundleError(f"bundle has {file_size - self.file_length} unexpected trailing bytes")


def store_manifest(manifest: bytes) -> tuple[bytes, int]:
    """The manifest's bytes as the file stores them, and the header flags that say how."""
    return zlib.compress(manifest, 9), DEFLATE


def load_manifest(stored: bytes, flags: int) -> bytes:
    """The manifest's canonical JSON from its stored bytes (signed ones: the signature is checked
    first); inflating stops past MAX_MANIFEST_BYTES."""
    if not flags & DEFLATE:
        return stored
    inflate = zlib.decompressobj()
    try:
        out = inflate.decompress(stored, MAX_MANIFEST_BYTES)
    except zlib.error:
        raise BundleError("the compressed manifest is corrupt") from None
    if inflate.unconsumed_tail:
        raise BundleError(f"the manifest inflates to more than {MAX_MANIFEST_BYTES} bytes")
    if not inflate.eof or inflate.unused_data:
        raise BundleError("the compressed manifest is truncated or has trailing bytes")
    return out


@dataclass(frozen=True)
class WeightEntry:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int  # relative to the data region
    length: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.value, "shape": list(self.shape),
                "offset": self.offset, "length": self.length, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    """Everything signed besides the header: metadata, the graph's text form, the weight table."""

    name: str
    version: str
    producer: str
    graph: str
    inputs: tuple[tuple[str, str], ...]  # (value name, type text)
    outputs: tuple[tuple[str, str], ...]
    weights: tuple[WeightEntry, ...]
    lineage: Lineage | None = None  # only in a fine-tuned version; absent (not null) otherwise

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name, "version": self.version, "producer": self.producer, "graph": self.graph,
            "inputs": [{"name": n, "type": t} for n, t in self.inputs],
            "outputs": [{"name": n, "type": t} for n, t in self.outputs],
            "weights": [w.to_json() for w in self.weights],
        }
        if self.lineage is not None:
            out["lineage"] = self.lineage.to_json()
        return out

    def encode(self) -> bytes:
        return canonical_json(self.to_json())

    @property
    def content_hash(self) -> str:
        """SHA-256 of the manifest: names graph, weights (by their hashes) and metadata, not the signer."""
        return sha256(self.encode()).hexdigest()

    @property
    def data_length(self) -> int:
        return self.weights[-1].offset + self.weights[-1].length if self.weights else 0

    @classmethod
    def decode(cls, data: bytes, max_entries: int = 1 << 16) -> Manifest:
        """Parse signed manifest bytes; every field's type and bound is checked, or BundleError.

        The text is parsed only within :func:`manifest_budget` (at most ``max_entries`` inputs, outputs
        and weights each), so what the parse builds is bounded by the limits, whatever the text.
        """
        obj = loads_bounded(data, manifest_budget(max_entries), BundleError, "manifest")
        if canonical_json(obj, strict=False) != data:
            raise BundleError("manifest is not in canonical form")
        keys = ("name", "version", "producer", "graph", "inputs", "outputs", "weights")
        top = _fields(obj, "manifest", keys + ("lineage",) if isinstance(obj, dict) and "lineage" in obj else keys)
        manifest = cls(
            name=_text(top["name"], "name", MAX_NAME_CHARS),
            version=_text(top["version"], "version", MAX_NAME_CHARS),
            producer=_text(top["producer"], "producer", MAX_NAME_CHARS),
            graph=_string(top["graph"], "graph", MAX_MANIFEST_BYTES),
            inputs=_signature_list(top["inputs"], "inputs"),
            outputs=_signature_list(top["outputs"], "outputs"),
            weights=tuple(_weight(w, i) for i, w in enumerate(_list(top["weights"], "weights"))),
            lineage=Lineage.from_json(top["lineage"]) if "lineage" in top else None,
        )
        manifest._check_weight_layout()
        return manifest

    def _check_weight_layout(self) -> None:
        """Segments sit at the canonical offsets: in table order, each at the next 64-byte boundary."""
        end, names = 0, set()
        for w in self.weights:
            if w.name in names:
                raise BundleError(f"weight {w.name!r} is listed twice")
            names.add(w.name)
            if w.offset != align(end):
                raise BundleError(f"weight {w.name!r} is at offset {w.offset}, expected {align(end)}")
            end = w.offset + w.length


def manifest_budget(max_entries: int) -> JsonBudget:
    """The most a manifest of at most ``max_entries`` inputs, outputs and weights each can hold: per
    entry a weight's two containers (itself, its shape), nine strings (six keys, name, dtype, hash)
    and its fields and dimensions; the top level and a lineage within the constant."""
    entries = 3 * max_entries
    return JsonBudget(objects=1 + entries, strings=9 * entries + _TOP_LEVEL, containers=2 * entries + _TOP_LEVEL,
                      values=(MAX_RANK + 8) * entries + _TOP_LEVEL)


def canonical_json(obj: Any, strict: bool = True) -> bytes:
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")
    except (ValueError, TypeError, RecursionError):
        if strict:
            raise
        return b""


def _fields(value: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BundleError(f"{where} must be an object")
    if set(value) != set(keys):
        missing, extra = sorted(set(keys) - set(value)), sorted(set(value) - set(keys))
        problems = [f"missing fields {missing[:5]}"] * bool(missing) + [f"unknown fields {extra[:5]}"] * bool(extra)
        raise BundleError(f"{where} has {' and '.join(problems)}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise BundleError(f"{where} must be a list")
    return value


def _string(value: Any, where: str, max_chars: int) -> str:
    if not isinstance(value, str) or len(value) > max_chars:
        raise BundleError(f"{where} must be a string of at most {max_chars} characters")
    return value


def _text(value: Any, where: str, max_chars: int) -> str:
    """A string shown to people: printable only, so it cannot smuggle terminal escapes."""
    value = _string(value, where, max_chars)
    if not value.isprintable():
        raise BundleError(f"{where} contains control characters")
    return value


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BundleError(f"{where} must be an integer in [{lo}, {hi}]")
    return value


def _signature_list(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    out = []
    for i, item in enumerate(_list(value, where)):
        f = _fields(item, f"{where}[{i}]", ("name", "type"))
        out.append((_string(f["name"], f"{where}[{i}].name", MAX_NAME_CHARS),
                    _string(f["type"], f"{where}[{i}].type", MAX_NAME_CHARS)))
    return tuple(out)


def _weight(value: Any, i: int) -> WeightEntry:
    where = f"weights[{i}]"
    f = _fields(value, where, ("name", "dtype", "shape", "offset", "length", "sha256"))
    name = _string(f["name"], f"{where}.name", MAX_NAME_CHARS)
    dtype_text = _string(f["dtype"], f"{where}.dtype", 12)
    if dtype_text not in _DTYPE_NAMES:
        raise BundleError(f"{where} has unknown dtype {dtype_text!r}")
    dtype = DType(dtype_text)
    dims = _list(f["shape"], f"{where}.shape")
    if len(dims) > MAX_RANK:
        raise BundleError(f"{where} has rank {len(dims)}, more than {MAX_RANK}")
    shape = tuple(_int(d, f"{where}.shape", 0, MAX_ELEMENTS) for d in dims)
    bound, numel = 1, 1
    for d in shape:  # checked products: stop as soon as the bound is passed
        bound, numel = bound * max(d, 1), numel * d
        if bound > MAX_ELEMENTS:
            raise BundleError(f"{where} has a shape with more than {MAX_ELEMENTS} elements")
    length = _int(f["length"], f"{where}.length", 0, MAX_ELEMENTS * 8)
    if length != packed_nbytes(dtype, numel):
        raise BundleError(f"{where}: length {length} does not match {dtype.value}{list(shape)}")
    offset = _int(f["offset"], f"{where}.offset", 0, MAX_ELEMENTS * 8)
    digest = _string(f["sha256"], f"{where}.sha256", 64)
    if not _HEX64.fullmatch(digest):
        raise BundleError(f"{where}.sha256 must be 64 lowercase hex digits")
    return WeightEntry(name, dtype, shape, offset, length, digest)
