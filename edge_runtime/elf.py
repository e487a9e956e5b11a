"""A bounds-checked reader of ELF64 little-endian relocatable objects (the files LLVM emits).

Cuvil's own loader (:mod:`.objload`) links these without llvmlite. Every offset, size and index is
checked against the file before it is used, so a truncated or garbled object raises
:class:`ObjectFormatError`, never an IndexError, a huge allocation or a read outside the bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..compiler.errors import CompileError

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym
RELA = struct.Struct("<QQq")  # Elf64_Rela

ET_REL = 1
SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS = 2, 3, 4, 8
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHN_UNDEF, SHN_LORESERVE, SHN_ABS, SHN_COMMON = 0, 0xFF00, 0xFFF1, 0xFFF2
STB_GLOBAL, STB_WEAK = 1, 2
MAX_SECTIONS = 1 << 16


class ObjectFormatError(CompileError):
    """The bytes are no well-formed ELF64 little-endian relocatable object."""


@dataclass(frozen=True)
class Section:
    name: str
    kind: int  # sh_type
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int

    @property
    def allocated(self) -> bool:
        return bool(self.flags & SHF_ALLOC)


@dataclass(frozen=True)
class Symbol:
    name: str
    bind: int  # STB_*
    section: int  # st_shndx
    value: int

    @property
    def exported(self) -> bool:
        return self.bind in (STB_GLOBAL, STB_WEAK) and self.section != SHN_UNDEF


@dataclass(frozen=True)
class Relocation:
    offset: int  # in the target section
    kind: int  # R_<machine>_* number
    symbol: int  # index into the symbol table (0: none)
    addend: int


@dataclass(frozen=True)
class ElfObject:
    machine: int  # e_machine
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]  # entry 0 is the null symbol
    relocations: tuple[tuple[int, tuple[Relocation, ...]], ...]  # (target section index, its relocations)


def _fail(what: str):
    raise ObjectFormatError(f"malformed object file: {what}")


def _span(data: bytes, offset: int, size: int, what: str) -> memoryview:
    if offset < 0 or size < 0 or offset + size > len(data):
        _fail(f"{what} lies outside the file")
    return memoryview(data)[offset:offset + size]


def _name(strtab: bytes, at: int) -> str:
    end = strtab.find(b"\0", at)
    if at >= len(strtab) or end < 0:
        _fail("a name lies outside its string table")
    try:
        return strtab[at:end].decode("ascii")
    except UnicodeDecodeError:
        _fail("a name is not ASCII")


def read_object(data: bytes) -> ElfObject:
    """Parse the headers, the one symbol table and every RELA table; raise ObjectFormatError on any inconsistency."""
    if len(data) < EHDR.size:
        _fail("shorter than its header")
    ident, etype, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx = EHDR.unpack_from(data)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        _fail("not ELF64 little-endian")
    if etype != ET_REL or shentsize != SHDR.size or not 0 < shnum < MAX_SECTIONS or shstrndx >= shnum:
        _fail("not a relocatable object with a section table")
    table = _span(data, shoff, shnum * SHDR.size, "the section table")
    raw = [SHDR.unpack_from(table, i * SHDR.size) for i in range(shnum)]
    for kind, offset, size in ((r[1], r[4], r[5]) for r in raw):
        if kind != SHT_NOBITS:
            _span(data, offset, size, "a section")
    names = bytes(_span(data, raw[shstrndx][4], raw[shstrndx][5], "the section names"))
    sections = tuple(Section(_name(names, r[0]), r[1], r[2], r[4], r[5], r[6], r[7], r[8]) for r in raw)
    for s in sections:
        if s.align > 1 << 16 or s.align & (s.align - 1):
            _fail(f"section {s.name} has alignment {s.align}")
    symtabs = [i for i, s in enumerate(sections) if s.kind == SHT_SYMTAB]
    if len(symtabs) > 1:
        _fail("more than one symbol table")
    symbols = _symbols(data, sections, symtabs[0]) if symtabs else ()
    return ElfObject(machine, sections, symbols, _relocations(data, sections, symtabs[0] if symtabs else -1, len(symbols)))


def _symbols(data: bytes, sections: tuple[Section, ...], index: int) -> tuple[Symbol, ...]:
    tab = sections[index]
    if tab.size % SYM.size or tab.link >= len(sections) or sections[tab.link].kind != SHT_STRTAB:
        _fail("bad symbol table")
    strtab = bytes(_span(data, sections[tab.link].offset, sections[tab.link].size, "the symbol names"))
    out = []
    for name_at, info, _, shndx, value, _ in SYM.iter_unpack(_span(data, tab.offset, tab.size, "the symbol table")):
        if shndx != SHN_UNDEF and shndx < SHN_LORESERVE and shndx >= len(sections):
            _fail("a symbol's section does not exist")
        out.append(Symbol(_name(strtab, name_at) if name_at else "", info >> 4, shndx, value))
    return tuple(out)


def _relocations(data: bytes, sections: tuple[Section, ...], symtab: int,
                 symbol_count: int) -> tuple[tuple[int, tuple[Relocation, ...]], ...]:
    out = []
    for s in sections:
        if s.kind != SHT_RELA:
            continue
        if s.size % RELA.size or s.link != symtab or not 0 < s.info < len(sections):
            _fail(f"bad relocation table {s.name}")
        target = sections[s.info]
        relocs = []
        for offset, info, addend in RELA.iter_unpack(_span(data, s.offset, s.size, "a relocation table")):
            if info >> 32 >= symbol_count or offset >= target.size:
                _fail(f"a relocation of {target.name} points outside it or its symbols")
            relocs.append(Relocation(offset, info & 0xFFFFFFFF, info >> 32, addend))
        out.append((s.info, tuple(relocs)))
    return tuple(out)


def global_names(obj: bytes) -> tuple[set[str], set[str]]:
    """The global names the object defines and those it uses without defining (none for a malformed file)."""
    try:
        symbols = read_object(obj).symbols
    except ObjectFormatError:
        return set(), set()
    named = [s for s in symbols[1:] if s.bind in (STB_GLOBAL, STB_WEAK) and s.name]
    return {s.name for s in named if s.section != SHN_UNDEF}, {s.name for s in named if s.section == SHN_UNDEF}
