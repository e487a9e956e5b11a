"""Cuvil's own loader of the x86-64 objects LLVM emits: a warm start links its cached code without llvmlite.

MCJIT cost a warm ResNet-18 ~5 ms and pulled libLLVM (~45 MB resident) into every device process.
Here the objects are laid out in one anonymous mapping (code, read-only data, writable data, each on
pages of its own), relocated and resolved while the mapping is writable and not executable, then
the code pages become read+execute and the constant pages read-only (W^X: never both at once).
External symbols (memset, pthread_create, ...) come from the process (``dlsym``) through a small GOT;
a call to one goes through an 8-byte stub, since libc may lie farther than 2 GiB from the code.

Only what is known is done: another machine, relocation type, section kind, common or TLS symbol,
or a displacement that does not fit raises :class:`UnsupportedObjectError`, and the caller loads the
objects with llvmlite instead. A malformed object raises :class:`~.elf.ObjectFormatError`.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import struct
from dataclasses import dataclass

from ..compiler.errors import CompileError
from . import elf

EM_X86_64 = 62
R_NONE, R_64, R_PC32, R_GOTPCREL, R_32, R_32S, R_PC64 = 0, 1, 2, 9, 10, 11, 24
R_PLT32, R_GOTPCRELX, R_REX_GOTPCRELX = 4, 41, 42
GOT_RELATIVE = frozenset({R_GOTPCREL, R_GOTPCRELX, R_REX_GOTPCRELX})
SUPPORTED = frozenset({R_NONE, R_64, R_PC32, R_32, R_32S, R_PC64, R_PLT32}) | GOT_RELATIVE
SECTION_KINDS = frozenset({1, elf.SHT_NOBITS, 0x70000001})  # PROGBITS, NOBITS, X86_64_UNWIND (.eh_frame)
MAX_IMAGE = 1 << 30
STUB = b"\xff\x25"  # jmp qword ptr [rip + rel32], padded to 8 bytes
STUB_SIZE = 8
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
_PAGE = mmap.PAGESIZE
_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")


class UnsupportedObjectError(CompileError):
    """The object uses something this loader does not implement: load it with llvmlite instead."""


@dataclass
class LoadedCode:
    """The entry points of a loaded model; ``keep`` (an :class:`Image` or an MCJIT engine) keeps the code mapped.

    Each load has its own copy of the code, so the ``_bind`` globals belong to one session.
    """

    keep: object
    address: int  # void entry(i8* arena, i8* weights)
    bind: int  # void entry_bind(i8* arena, i8* weights)
    bound: int  # void entry_bound(void)
    start: int = 0  # void entry_start(void): create the worker threads (none at one thread)
    stop: int = 0  # void entry_stop(void): join them
    detach: int = 0  # void entry_detach(void): forget them (a forked child)


def entry_names(entry: str) -> list[str]:
    return [entry] + [f"{entry}_{n}" for n in ("bind", "bound", "start", "stop", "detach")]


def code_for(keep: object, addresses: tuple[int, ...], entry: str) -> LoadedCode:
    if not all(addresses[:3]):  # the pool's functions are absent from hand-written test objects
        raise CompileError(f"entry point {entry!r} not found in the compiled object")
    return LoadedCode(keep, *addresses)


SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux


def request_amx() -> None:
    """Ask Linux for the AMX tile state of this process (idempotent): without it the first tile
    instruction raises SIGILL."""
    if platform.machine() != "x86_64":
        raise CompileError(f"AMX tile state exists on x86-64 only, this machine is {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        raise CompileError(f"this CPU or kernel gives no AMX tile state (arch_prctl errno {ctypes.get_errno()})")


class Image:
    """One anonymous mapping holding the linked code; unmapped when the last reference goes."""

    def __init__(self, size: int):
        # private: a forked child's writes to the code's globals (its pool state) must not reach this process
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE, prot=PROT_READ | PROT_WRITE)
        self._view = ctypes.c_char.from_buffer(self.map)  # an export: the mapping cannot be closed under the code
        self.base = ctypes.addressof(self._view)
        self.size = size

    def protect(self, offset: int, size: int, prot: int) -> None:
        if size and _libc().mprotect(ctypes.c_void_p(self.base + offset), ctypes.c_size_t(size), prot) != 0:
            raise CompileError(f"mprotect failed (errno {ctypes.get_errno()})")


_LIBC: list = []


def _libc():
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
        _LIBC[0].mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return _LIBC[0]


def process_symbol(name: str) -> int:
    """The address of ``name`` in this process (libc, libm, libpthread...); 0 when there is none."""
    try:
        return ctypes.cast(_libc()[name], ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


def _region(s: elf.Section) -> int:
    """0 code, 1 read-only data, 2 writable data."""
    if s.kind not in SECTION_KINDS or s.flags & elf.SHF_TLS:
        raise UnsupportedObjectError(f"section {s.name} of type {s.kind:#x} flags {s.flags:#x}")
    if s.flags & elf.SHF_WRITE and s.flags & elf.SHF_EXECINSTR:
        raise UnsupportedObjectError(f"section {s.name} is writable and executable")
    return 0 if s.flags & elf.SHF_EXECINSTR else 2 if s.flags & elf.SHF_WRITE else 1


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class _Layout:
    places: list[dict[int, int]]  # per object: allocated section index -> offset in the image
    regions: tuple[tuple[int, int], ...]  # (offset, size) of code, read-only data, writable data
    got: dict[object, int]  # symbol key -> offset of its GOT slot
    stubs: dict[str, int]  # external name -> offset of its call stub
    size: int


def _keys(objs: list[elf.ElfObject], exported: dict[str, tuple[int, elf.Symbol]]):
    """GOT keys and stub names the relocations need (a key: a global's name or (object, symbol index))."""
    got, stubs = {}, {}
    for k, o in enumerate(objs):
        for target, relocs in o.relocations:
            if not o.sections[target].allocated:
                continue
            for r in relocs:
                if r.kind not in SUPPORTED:
                    raise UnsupportedObjectError(f"relocation type {r.kind} in {o.sections[target].name}")
                sym = o.symbols[r.symbol]
                key = sym.name if sym.bind in (elf.STB_GLOBAL, elf.STB_WEAK) and sym.name else (k, r.symbol)
                if r.kind in GOT_RELATIVE:
                    got.setdefault(key, None)
                elif r.kind == R_PLT32 and sym.section == elf.SHN_UNDEF and key not in exported:
                    stubs.setdefault(key, None)
                    got.setdefault(key, None)
    return list(got), list(stubs)


def _layout(objs: list[elf.ElfObject], got_keys: list, stub_names: list[str]) -> _Layout:
    ends = [0, 0, 0]
    places: list[dict[int, int]] = []
    pending = []
    for o in objs:
        mine: dict[int, int] = {}
        for i, s in enumerate(o.sections):
            if not s.allocated or (not s.size and s.kind != elf.SHT_NOBITS):
                continue
            r = _region(s)
            at = _align(ends[r], max(s.align, 1))
            ends[r] = at + s.size
            if ends[r] > MAX_IMAGE:
                raise elf.ObjectFormatError("malformed object file: the sections exceed the image limit")
            mine[i] = at
            pending.append((len(places), i, r))
        places.append(mine)
    stub_at = _align(ends[0], 16)
    ends[0] = stub_at + STUB_SIZE * len(stub_names)
    got_at = _align(ends[1], 8)
    ends[1] = got_at + 8 * len(got_keys)
    starts, pos = [], 0
    for r in range(3):
        starts.append(pos)
        pos += _align(ends[r], _PAGE)
    for k, i, r in pending:
        places[k][i] += starts[r]
    return _Layout(places, tuple((starts[r], _align(ends[r], _PAGE)) for r in range(3)),
                   {key: starts[1] + got_at + 8 * n for n, key in enumerate(got_keys)},
                   {name: starts[0] + stub_at + STUB_SIZE * n for n, name in enumerate(stub_names)}, max(pos, _PAGE))


def _exports(objs: list[elf.ElfObject]) -> dict[str, tuple[int, elf.Symbol]]:
    out: dict[str, tuple[int, elf.Symbol]] = {}
    for k, o in enumerate(objs):
        for s in o.symbols[1:]:
            if not (s.exported and s.name):
                continue
            if s.section == elf.SHN_COMMON or s.section >= elf.SHN_LORESERVE and s.section != elf.SHN_ABS:
                raise UnsupportedObjectError(f"symbol {s.name} in special section {s.section:#x}")
            if s.name in out and s.bind == elf.STB_GLOBAL and out[s.name][1].bind == elf.STB_GLOBAL:
                raise elf.ObjectFormatError(f"malformed object files: {s.name} is defined twice")
            if s.name not in out or out[s.name][1].bind == elf.STB_WEAK:
                out[s.name] = (k, s)
    return out


IN_IMAGE, ABSOLUTE, EXTERNAL = 0, 1, 2
"""Where a symbol's address comes from: the image's base plus an offset, the object itself, the process."""


class _Linker:
    def __init__(self, data: list[bytes], objs: list[elf.ElfObject], image: Image, layout: _Layout,
                 exported: dict[str, tuple[int, elf.Symbol]], fixups: list[tuple[int, str]] | None = None):
        """``fixups``: prelink (:mod:`.prelink`) into ``image`` at base 0 and append to it each 8-byte value a
        load must complete, as (offset, "" to add the base, or the external symbol whose address to add)."""
        self.data, self.objs, self.image, self.layout, self.exported = data, objs, image, layout, exported
        self.externals: dict[str, int] = {}
        self.fixups = fixups

    def defined(self, k: int, sym: elf.Symbol) -> int:
        """The address of a symbol defined in object ``k``."""
        if sym.section == elf.SHN_ABS:
            return sym.value
        if sym.section == elf.SHN_UNDEF or sym.section >= elf.SHN_LORESERVE:
            raise UnsupportedObjectError(f"symbol {sym.name or '?'} in special section {sym.section:#x}")
        place = self.layout.places[k].get(sym.section)
        sec = self.objs[k].sections[sym.section]
        if place is None or sym.value > sec.size:
            raise elf.ObjectFormatError("malformed object file: a symbol lies outside a loaded section")
        return self.image.base + place + sym.value

    def address(self, k: int, index: int) -> tuple[object, int, int]:
        """(key, address, IN_IMAGE / ABSOLUTE / EXTERNAL) of symbol ``index`` of object ``k``."""
        sym = self.objs[k].symbols[index]
        if sym.bind in (elf.STB_GLOBAL, elf.STB_WEAK) and sym.name:
            if sym.name in self.exported:
                ko, s = self.exported[sym.name]
                return sym.name, self.defined(ko, s), ABSOLUTE if s.section == elf.SHN_ABS else IN_IMAGE
            if sym.section == elf.SHN_UNDEF:
                return sym.name, self.external(sym.name), EXTERNAL
        if not index or sym.section == elf.SHN_ABS:
            return (k, index), self.defined(k, sym) if index else 0, ABSOLUTE
        return (k, index), self.defined(k, sym), IN_IMAGE

    def external(self, name: str) -> int:
        """``name``'s address in this process (0 when prelinking: a load adds it); Unsupported when it has none."""
        if name not in self.externals:
            if not process_symbol(name):
                raise UnsupportedObjectError(f"the code calls {name}, which this process does not define")
            self.externals[name] = 0 if self.fixups is not None else process_symbol(name)
        return self.externals[name]

    def complete(self, at: int, key: object, kind: int) -> None:
        """Prelinking: the 8-byte value at ``at`` gets the base or ``key``'s address added at load."""
        if self.fixups is not None and kind != ABSOLUTE:
            self.fixups.append((at, key if kind == EXTERNAL else ""))

    def fixed(self, r: elf.Relocation, depends: bool) -> None:
        """Prelinking: a value of a width or form no load completes must not depend on where things are."""
        if self.fixups is not None and depends:
            raise UnsupportedObjectError(f"relocation type {r.kind} to that symbol cannot be prelinked")

    def link(self) -> None:
        m, base = self.image.map, self.image.base
        for k, o in enumerate(self.objs):
            for target, relocs in o.relocations:
                sec = o.sections[target]
                if not sec.allocated:
                    continue
                if sec.kind == elf.SHT_NOBITS:
                    raise elf.ObjectFormatError(f"malformed object file: relocations of {sec.name}, which has no bytes")
                at = self.layout.places[k].get(target)
                if at is None:
                    continue  # an empty section: its relocations point outside it, checked by elf
                for r in relocs:
                    self.apply(m, k, at + r.offset, base + at + r.offset, r, sec.size - r.offset)

    def fill(self) -> None:
        """Section bytes, GOT slots and stubs, before any relocation reads them."""
        m = self.image.map
        for k, o in enumerate(self.objs):
            for i, at in self.layout.places[k].items():
                s = o.sections[i]
                if s.kind != elf.SHT_NOBITS:
                    m[at:at + s.size] = self.data[k][s.offset:s.offset + s.size]
        for key, slot in self.layout.got.items():
            address, kind = self._key_address(key)
            _U64.pack_into(m, slot, address)
            self.complete(slot, key, kind)
        for name, stub in self.layout.stubs.items():
            rel = self.layout.got[name] - (stub + 6)
            m[stub:stub + 6] = STUB + _I32.pack(rel)

    def _key_address(self, key) -> tuple[int, int]:
        if isinstance(key, tuple):
            return self.address(*key)[1:]
        if key in self.exported:
            ko, s = self.exported[key]
            return self.defined(ko, s), ABSOLUTE if s.section == elf.SHN_ABS else IN_IMAGE
        return self.external(key), EXTERNAL

    def apply(self, m: mmap.mmap, k: int, at: int, place: int, r: elf.Relocation, room: int) -> None:
        if r.kind == R_NONE:
            return
        key, s, kind = self.address(k, r.symbol)
        if r.kind in GOT_RELATIVE:
            value, width, signed = self.image.base + self.layout.got[key] + r.addend - place, 4, True
        elif r.kind == R_PLT32 and kind == EXTERNAL:
            value, width, signed = self.image.base + self.layout.stubs[key] + r.addend - place, 4, True
        elif r.kind in (R_PC32, R_PLT32):
            self.fixed(r, kind != IN_IMAGE)
            value, width, signed = s + r.addend - place, 4, True
        elif r.kind == R_PC64:
            self.fixed(r, kind != IN_IMAGE)
            value, width, signed = (s + r.addend - place) & (1 << 64) - 1, 8, False
        elif r.kind == R_64:
            self.complete(at, key, kind)
            value, width, signed = (s + r.addend) & (1 << 64) - 1, 8, False
        else:  # R_32 (zero-extended), R_32S (sign-extended)
            self.fixed(r, kind != ABSOLUTE)
            value, width, signed = s + r.addend, 4, r.kind == R_32S
        if width > room:
            raise elf.ObjectFormatError("malformed object file: a relocation runs past its section")
        if width == 4 and not (-(1 << 31) <= value < 1 << 31 if signed else 0 <= value < 1 << 32):
            raise UnsupportedObjectError(f"relocation type {r.kind} does not reach its target")
        (_I32 if signed else _U32 if width == 4 else _U64).pack_into(m, at, value)


REGION_PROT = (PROT_READ | PROT_EXEC, PROT_READ, PROT_READ | PROT_WRITE)  # code, read-only data, writable data


def linker(objects: list[bytes], image_of, fixups: list[tuple[int, str]] | None = None) -> _Linker:
    """A linker of ``objects`` into ``image_of(size)``: an :class:`Image`, or for :mod:`.prelink` anything
    with ``map``, ``base`` and ``size`` (``fixups``: the list that collects what a load completes)."""
    if platform.machine() != "x86_64":
        raise UnsupportedObjectError(f"no own loader for {platform.machine()}")
    objs = [elf.read_object(o) for o in objects]
    for o in objs:
        if o.machine != EM_X86_64:
            raise UnsupportedObjectError(f"object for machine {o.machine}")
    exported = _exports(objs)
    got_keys, stub_names = _keys(objs, exported)
    layout = _layout(objs, got_keys, stub_names)
    image = image_of(layout.size)
    return _Linker(objects, objs, image, layout, exported, fixups)


def load(objects: list[bytes], names: list[str]) -> tuple[Image, tuple[int, ...]]:
    """Link ``objects`` into one new image; the image and the address of each of ``names`` (0: absent)."""
    link = linker(objects, Image)
    link.fill()
    link.link()
    for (offset, size), prot in zip(link.layout.regions, REGION_PROT):
        link.image.protect(offset, size, prot)
    return link.image, tuple(link.defined(*link.exported[n]) if n in link.exported else 0 for n in names)


def load_object(objects: list[bytes], entry: str, amx: bool = False) -> LoadedCode:
    """The model's entry points in a new image (:func:`load`); ``amx``: request the tile state first."""
    if amx:
        request_amx()
    image, addresses = load(objects, entry_names(entry))
    return code_for(image, addresses, entry)

