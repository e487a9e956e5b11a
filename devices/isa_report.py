"""Which vector ISA a compiled model really uses: count SVE, NEON, AVX-512, AVX2 and SSE instructions,
and among them the integer dot products an int8 model should be made of.

A profile says what the device has; only the object code says what it will run. The count is over
a disassembly (``objdump -d`` of the object file) or over LLVM's assembly text; each instruction is
put in the first class whose pattern its line matches, most capable ISA first, so an SVE
instruction that also names a NEON register counts once, as SVE. The checks it backs: SVE2 builds
contain SVE, NEON builds (Jetson, Raspberry Pi) contain none, AVX-512 builds use ``zmm``, and int8
builds use the target's integer dot product (``sdot`` with dotprod, ``vpdpbusd`` with VNNI, ...).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..compiler.errors import CuvilError

ISA_CLASSES: Mapping[str, tuple[tuple[str, re.Pattern[str]], ...]] = {
    "aarch64": (
        ("SVE", re.compile(r"\bz\d+\.[bhsdq]\b|\bz\d+\b|\bp\d+(/[zm]|\.[bhsd])|\b(whilel[eot]|whileh[is]|ptrue|pfalse|"
                           r"ptest|cnt[bhwd]|inc[bhwd]|dec[bhwd]|addvl|rdvl)\b")),
        ("NEON", re.compile(r"\bv\d+\.\d*[bhsd]\b|\bv\d+\.[bhsd]\[\d+\]|\bq\d+\b")),
    ),
    "x86_64": (
        ("AVX-512", re.compile(r"%?\bzmm\d+\b|\{%?k[1-7]\}")),
        ("AVX2", re.compile(r"%?\bymm\d+\b")),
        ("SSE", re.compile(r"%?\bxmm\d+\b")),
    ),
}
"""Per architecture, instruction classes in priority order: (name, pattern over one instruction)."""

INT_DOT: Mapping[str, re.Pattern[str]] = {
    "aarch64": re.compile(r"^(sdot|udot|usdot|sudot|smmla|ummla|usmmla)\b"),
    "x86_64": re.compile(r"^(\{vex\}\s*)?(vpdpbusds?|vpdpbssds?|vpdpbsuds?|vpdpbuuds?|vpdpwssds?|vpmaddubsw|vpmaddwd|"
                         r"pmaddubsw|pmaddwd|tdpbusd|tdpbssd|tdpbsud|tdpbuud)\b"),
}
"""Per architecture, the integer dot-product instructions (NEON/SVE dot and matrix multiply-add,
VNNI, the AVX2 pair multiply-adds, AMX-INT8 tile products), counted apart from the ISA classes."""

OBJDUMPS: Mapping[str, tuple[str, ...]] = {
    "aarch64": ("aarch64-linux-gnu-objdump", "llvm-objdump"),
    "x86_64": ("objdump", "llvm-objdump"),
}
"""Disassemblers that can read each architecture's objects, first found wins."""

# one instruction per line: objdump --no-show-raw-insn "  4:\t<mnemonic> ops", LLVM asm "\t<mnemonic>\tops"
_OBJDUMP_LINE = re.compile(r"^\s*[0-9a-f]+:\s+(\S.*)$")
_COMMENT = {"aarch64": "//", "x86_64": "#"}
_ASM_LINE = re.compile(r"^\s+([a-z][\w.]*)(\s.*)?$")


class IsaReportError(CuvilError):
    """The object code could not be disassembled."""


@dataclass(frozen=True)
class IsaReport:
    """Instruction counts by vector ISA class (plus ``total``) for one architecture."""

    arch: str
    counts: Mapping[str, int] = field(default_factory=dict)
    total: int = 0
    int_dot: int = 0  # integer dot-product instructions (each also counted in its ISA class)
    dots: Mapping[str, int] = field(default_factory=dict)  # "<mnemonic> <class>" -> count, e.g. "sdot SVE"

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)

    @property
    def vector_isa(self) -> str:
        """The most capable class present, or ``"scalar"``."""
        for name, _ in ISA_CLASSES.get(self.arch, ()):
            if self[name]:
                return name
        return "scalar"

    def summary(self) -> str:
        parts = ", ".join(f"{name} {self[name]}" for name, _ in ISA_CLASSES.get(self.arch, ()))
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.dots.items()))
        dots = f"; integer dot products {self.int_dot}" + (f" ({kinds})" if kinds else "") if self.int_dot else ""
        return f"vector ISA: {self.vector_isa} ({parts}; {self.total} instructions{dots})"


def arch_of(triple: str) -> str:
    arch = triple.split("-", 1)[0]
    return "aarch64" if arch == "arm64" else arch


def classify(instructions: list[str], arch: str) -> IsaReport:
    classes = ISA_CLASSES.get(arch, ())
    counts = {name: 0 for name, _ in classes}
    dot = INT_DOT.get(arch)
    dots: dict[str, int] = {}
    for ins in instructions:
        cls = next((name for name, pattern in classes if pattern.search(ins)), "scalar")
        if cls in counts:
            counts[cls] += 1
        found = dot.search(ins.strip()) if dot else None
        if found:
            key = f"{found.group(0).split()[-1]} {cls}"  # an SVE sdot apart from a NEON one
            dots[key] = dots.get(key, 0) + 1
    return IsaReport(arch, counts, len(instructions), sum(dots.values()), dots)


def from_objdump(text: str, arch: str) -> IsaReport:
    """Count over ``objdump -d --no-show-raw-insn`` output."""
    found = [m.group(1) for m in map(_OBJDUMP_LINE.match, text.splitlines()) if m]
    return classify([s.split(_COMMENT.get(arch, "//"))[0] for s in found], arch)


def from_assembly(text: str, arch: str) -> IsaReport:
    """Count over LLVM's assembly text (``.s``); directives and labels are skipped."""
    comment = _COMMENT.get(arch, "//")
    found = [m.group(0).split(comment)[0].strip() for m in map(_ASM_LINE.match, text.splitlines()) if m]
    return classify([s for s in found if not s.startswith(".")], arch)


def find_objdump(arch: str) -> str | None:
    for name in OBJDUMPS.get(arch, ()):
        path = shutil.which(name)
        if path:
            return path
    return None


def from_object(obj: bytes, triple: str) -> IsaReport:
    """Disassemble a relocatable object with the first objdump that reads its architecture."""
    arch = arch_of(triple)
    tool = find_objdump(arch)
    if tool is None:
        raise IsaReportError(f"no disassembler for {arch} found (tried {', '.join(OBJDUMPS.get(arch, ()))}); "
                             "count over LLVM assembly text instead")
    with tempfile.TemporaryDirectory(prefix="cuvil-isa-") as tmp:
        path = Path(tmp) / "model.o"
        path.write_bytes(obj)
        done = subprocess.run([tool, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise IsaReportError(f"{Path(tool).name} could not disassemble the {arch} object: {done.stderr.strip()[:300]}")
    return from_objdump(done.stdout, arch)
