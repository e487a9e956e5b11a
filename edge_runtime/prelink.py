"""Objects linked once, at compile time, at address 0: a warm start copies the image and adds its base.

Linking a ResNet-18's 7 objects in Python (ELF parsing, layout, ~130 relocations resolved one by
one) cost a warm start ~1-1.7 ms. The result depends on where the image lands and where libc's
functions are only through a few 8-byte values (absolute addresses of the large code model, GOT
slots), so the cache entry keeps the image as linked at 0 and the list of those values; a load maps
fresh pages, copies the image, adds the base or the symbol's address to each value, and protects
the pages as :mod:`.objload` does (code read+execute and constants read-only only once complete).
Objects with a value no load completes (a 32-bit absolute address, a PC-relative reference to
something outside the image) are not prelinked; their entry is linked from its objects as before.
The image comes from a sealed cache entry (:mod:`.artifact`), checked before it is parsed; its
layout is bounds-checked again here all the same.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from . import elf
from .objload import (MAX_IMAGE, REGION_PROT, Image, LoadedCode, UnsupportedObjectError, code_for, entry_names, linker,
                      process_symbol, request_amx)

_PAGE = mmap.PAGESIZE
_U64 = struct.Struct("<Q")
_MASK = (1 << 64) - 1


class PrelinkError(ValueError):
    """A prelinked image whose layout does not hold together (the artifact is then a miss)."""


@dataclass(frozen=True)
class Prelinked:
    size: int  # bytes of the image, whole pages
    data: bytes  # the image linked at address 0, trailing zero bytes left out
    regions: tuple[tuple[int, int], ...]  # (offset, size) of code, read-only data, writable data
    fixups: tuple[tuple[int, str], ...]  # (offset of an 8-byte value, "" to add the base or the symbol to add)
    entries: tuple[int, ...]  # offset of each of objload.entry_names(entry); -1: absent

    def check(self) -> Prelinked:
        """This image itself when every offset lies where it may; PrelinkError otherwise."""
        if not 0 < self.size <= MAX_IMAGE or self.size % _PAGE or len(self.data) > self.size:
            raise PrelinkError("image size")
        if len(self.regions) != 3:
            raise PrelinkError("regions")
        end = 0
        for offset, size in self.regions:
            if offset != end or size < 0 or size % _PAGE or offset + size > self.size:
                raise PrelinkError("regions")
            end = offset + size
        if not all(0 <= at <= self.size - 8 and isinstance(name, str) for at, name in self.fixups):
            raise PrelinkError("a fixup outside the image")
        code_end = self.regions[0][1]
        if not all(e == -1 or 0 <= e < code_end for e in self.entries):
            raise PrelinkError("an entry point outside the code")
        return self


class _AtZero:
    """Where :func:`prelink` links: plain bytes standing for an image at address 0."""

    base = 0

    def __init__(self, size: int):
        self.map, self.size = bytearray(size), size


def prelink(objects: list[bytes], entry: str) -> Prelinked:
    """``objects`` linked at address 0 (:class:`Prelinked`); UnsupportedObjectError when something in
    them cannot be completed by a load, or cannot be linked by :mod:`.objload` at all."""
    link = linker(objects, _AtZero, [])
    link.fill()
    link.link()
    exported = link.exported
    if any(exported[n][1].section == elf.SHN_ABS for n in entry_names(entry) if n in exported):
        raise UnsupportedObjectError("an entry point at an absolute address")
    entries = tuple(link.defined(*exported[n]) if n in exported else -1 for n in entry_names(entry))
    data = bytes(link.image.map).rstrip(b"\0")
    return Prelinked(link.image.size, data, link.layout.regions, tuple(link.fixups), entries).check()


def load_image(image: Prelinked) -> tuple[Image, tuple[int, ...]]:
    """A fresh copy of ``image``, completed and protected, and the address of each entry (0: absent);
    UnsupportedObjectError when this process lacks a symbol the code calls."""
    out = Image(image.size)
    m, base = out.map, out.base
    m[:len(image.data)] = image.data
    symbols = {"": base}
    for at, name in image.fixups:
        add = symbols.get(name) or symbols.setdefault(name, process_symbol(name))
        if not add:
            raise UnsupportedObjectError(f"the code calls {name}, which this process does not define")
        _U64.pack_into(m, at, (_U64.unpack_from(m, at)[0] + add) & _MASK)
    for (offset, size), prot in zip(image.regions, REGION_PROT):
        out.protect(offset, size, prot)
    return out, tuple(base + e if e >= 0 else 0 for e in image.entries)


def load_prelinked(image: Prelinked, entry: str, amx: bool = False) -> LoadedCode:
    """The model's entry points in a fresh copy of ``image`` (:func:`load_image`); ``amx``: request the
    tile state first."""
    if amx:
        request_amx()
    return code_for(*load_image(image), entry)
