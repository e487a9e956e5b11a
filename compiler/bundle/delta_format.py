"""The signed delta's layout and its manifest, parsed with every field and bound checked.

A delta is framed like a bundle (see :mod:`.format`), under its own magic::

    [0, 72)      header      DELTA_MAGIC, format version, flags, manifest length, data offset,
                             file length, signer's raw Ed25519 public key
    [72, 136)    signature   Ed25519 over header || stored manifest (the same signing as bundles)
    [136, ...)   manifest    canonical JSON, zlib-compressed (flag DEFLATE), at most 64 MiB inflated
    zero padding up to data_offset (a multiple of 64)
    data region  the payloads, back to back, in manifest order: the target's head, then one per
                 target weight; each zlib-compressed; the manifest holds the region's SHA-256

The manifest names the parent (content hash, and the SHA-256 and length of its exact bytes) and the
target (content hash, SHA-256 and length of the bundle the delta makes), so a delta applies to one
parent only and makes one bundle only. Each target weight is a piece: ``copy`` (a parent weight with
the same bytes, no payload), ``xor`` (the bytes XOR the parent weight ``base``, byte-planes grouped by
the dtype's width before compression: a fine-tuned float's sign, exponent and high mantissa bytes
mostly repeat) or ``raw`` (the bytes themselves). See docs/bundle-format.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import DeltaError
from .format import MANIFEST_OFFSET, MAX_MANIFEST_BYTES, MAX_NAME_CHARS, _fields, _int, _list, _string, _text, canonical_json
from .json_budget import JsonBudget, loads_bounded

DELTA_MAGIC = b"\x89CUVDL\r\n"
OPS = ("copy", "xor", "raw")
HEAD_ENCODINGS = ("zlib", "manifest")
MAX_PIECES = 1 << 16  # target weights a delta lists, at most (a bundle's manifest allows as many)
MAX_LENGTH = 1 << 51  # bound on any length or offset field (a device's own size limits are far lower)
MAX_HEAD = MANIFEST_OFFSET + MAX_MANIFEST_BYTES
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PIECE_FIELDS = 5  # name, op, base, offset, length
DELTA_BUDGET = JsonBudget(objects=2 + MAX_PIECES, strings=(_PIECE_FIELDS + 3) * MAX_PIECES + 64,
                          containers=MAX_PIECES + 8, values=(_PIECE_FIELDS + 1) * MAX_PIECES + 64)
"""The most a delta manifest can hold (:mod:`.json_budget`): per piece its object, its keys and three strings."""


@dataclass(frozen=True)
class Payload:
    offset: int  # in the delta's data region
    length: int  # stored (compressed) bytes

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "length": self.length}


@dataclass(frozen=True)
class Piece:
    name: str  # the target weight it makes
    op: str  # copy | xor | raw
    base: str  # the parent weight it reads ("" for raw)
    payload: Payload  # empty for copy

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "base": self.base, **self.payload.to_json()}


@dataclass(frozen=True)
class DeltaManifest:
    name: str  # the target's model name and version (shown to people)
    version: str
    parent: str  # content hash of the version it applies to
    parent_sha256: str  # ... and the SHA-256 and length of that bundle's exact bytes
    parent_length: int
    target: str  # content hash of the version it makes
    target_sha256: str
    target_length: int
    head: Payload  # the target's header, signature and stored manifest (see head_encoding)
    head_size: int  # the head payload's length, inflated
    pieces: tuple[Piece, ...]
    data_sha256: str  # of the data region: every payload
    head_encoding: str = "zlib"  # or "manifest": header, signature and the manifest's canonical JSON, deflated
    # against the parent's manifest as zlib dictionary (the two differ in a few hashes); the device stores
    # the manifest the way the writer does (:func:`.format.store_manifest`) to get the signed bytes back

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "parent": self.parent,
                "parent_sha256": self.parent_sha256, "parent_length": self.parent_length, "target": self.target,
                "target_sha256": self.target_sha256, "target_length": self.target_length,
                "data_sha256": self.data_sha256,
                "head": {**self.head.to_json(), "size": self.head_size, "encoding": self.head_encoding},
                "pieces": [p.to_json() for p in self.pieces]}

    def encode(self) -> bytes:
        return canonical_json(self.to_json())

    @property
    def data_length(self) -> int:
        return self.pieces[-1].payload.offset + self.pieces[-1].payload.length if self.pieces else \
            self.head.offset + self.head.length

    @classmethod
    def decode(cls, data: bytes) -> DeltaManifest:
        """Parse signed manifest bytes; any malformed field, or payloads not back to back, is a DeltaError."""
        obj = loads_bounded(data, DELTA_BUDGET, DeltaError, "delta manifest")
        if canonical_json(obj, strict=False) != data:
            raise DeltaError("delta manifest is not in canonical form")
        top = _fields(obj, "delta manifest", ("name", "version", "parent", "parent_sha256", "parent_length",
                                              "target", "target_sha256", "target_length", "data_sha256", "head",
                                              "pieces"))
        head = _fields(top["head"], "head", ("offset", "length", "size", "encoding"))
        if head["encoding"] not in HEAD_ENCODINGS:
            raise DeltaError(f"delta head has unknown encoding {str(head['encoding'])[:20]!r}")
        manifest = cls(
            name=_text(top["name"], "name", MAX_NAME_CHARS), version=_text(top["version"], "version", MAX_NAME_CHARS),
            parent=_hex(top["parent"], "parent"), parent_sha256=_hex(top["parent_sha256"], "parent_sha256"),
            parent_length=_int(top["parent_length"], "parent_length", 0, MAX_LENGTH),
            target=_hex(top["target"], "target"), target_sha256=_hex(top["target_sha256"], "target_sha256"),
            target_length=_int(top["target_length"], "target_length", 0, MAX_LENGTH),
            head=_payload(head, "head"), head_size=_int(head["size"], "head.size", MANIFEST_OFFSET, MAX_HEAD),
            pieces=tuple(_piece(p, i) for i, p in enumerate(_list(top["pieces"], "pieces"))),
            data_sha256=_hex(top["data_sha256"], "data_sha256"), head_encoding=head["encoding"],
        )
        manifest._check_layout()
        return manifest

    def _check_layout(self) -> None:
        end, names = 0, set()
        for where, p in (("head", self.head), *((f"piece {x.name!r}", x.payload) for x in self.pieces)):
            if p.offset != end:
                raise DeltaError(f"delta {where} is at offset {p.offset}, expected {end}")
            end = p.offset + p.length
        for piece in self.pieces:
            if piece.name in names:
                raise DeltaError(f"delta lists weight {piece.name!r} twice")
            names.add(piece.name)


def _hex(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise DeltaError(f"delta {where} must be 64 lowercase hex digits")
    return value


def _payload(f: Any, where: str) -> Payload:
    return Payload(_int(f["offset"], f"{where}.offset", 0, MAX_LENGTH), _int(f["length"], f"{where}.length", 0, MAX_LENGTH))


def _piece(value: Any, i: int) -> Piece:
    where = f"pieces[{i}]"
    f = _fields(value, where, ("name", "op", "base", "offset", "length"))
    op = _string(f["op"], f"{where}.op", 8)
    if op not in OPS:
        raise DeltaError(f"{where} has unknown op {op!r}")
    piece = Piece(_string(f["name"], f"{where}.name", MAX_NAME_CHARS), op,
                  _string(f["base"], f"{where}.base", MAX_NAME_CHARS), _payload(f, where))
    if (op == "raw") != (piece.base == ""):
        raise DeltaError(f"{where}: a raw piece names no base, a {op} piece needs one")
    if op == "copy" and piece.payload.length:
        raise DeltaError(f"{where}: a copy piece carries no payload")
    return piece
