"""Native compilation with llvmlite.binding: IR text -> optimized -> object file -> loaded entry.

Kept apart from the compiler (which only builds IR text) so the same object bytes can be cached on
disk, emitted for a foreign ISA, or loaded into this process. Uses LLVM's new pass manager (the
only one llvmlite 0.50 has) with the target machine attached, so the vectorizer costs for the
device's real CPU.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import llvmlite.binding as llvm

from ..compiler.errors import CompileError
from ..compiler.target import Target
from ..devices.detect import resolve_target

_LOCK = threading.Lock()
_READY: set[str] = set()
LLVM_OPTIONS = ("-sve-tail-folding=all", "-sve-tail-folding-insn-threshold=0")
"""Process-wide LLVM options; both act on SVE targets only (x86 and NEON code is unchanged): loops
become vector-length-agnostic predicated (whilelo) loops with no scalar tail, short ones included."""


def init_llvm(all_targets: bool = True) -> None:
    """Register the host's back end once, and every other one (for cross emission) unless
    ``all_targets=False``: loading cached code needs only the host's, and registering all of them
    costs a warm start ~2 ms and ~12 MB of touched library pages."""
    with _LOCK:
        if "native" not in _READY:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            for option in LLVM_OPTIONS:
                llvm.set_option("cuvil", option)
            _READY.add("native")
        if all_targets and "all" not in _READY:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _READY.add("all")


def host_target() -> Target:
    """The host as a Target (the device layer's detection: features, caches, tuning)."""
    return resolve_target("host")


def target_machine(target: Target, jit: bool = False) -> llvm.TargetMachine:
    init_llvm(all_targets=not jit)  # a JIT target machine is the host's
    try:
        t = llvm.Target.from_triple(target.triple)
    except RuntimeError as e:
        raise CompileError(f"LLVM has no back end for {target.triple!r}: {e}") from None
    return t.create_target_machine(cpu=target.cpu, features=target.feature_string, opt=3,
                                   reloc="default" if jit else "pic",
                                   codemodel="jitdefault" if jit else "default", jit=jit)


# Speed level 2 with the vectorizers on and the separate unrolling pass off: the GEMM/conv
# micro-kernels arrive already vectorized and unrolled, and the loop vectorizer interleaves the
# plain loops itself. Measured on the zoo (ResNet-18, MobileNetV2, transformer): 30-45% less LLVM
# time than level 3 with full unrolling, run time unchanged within noise.
SPEED_LEVEL = 2
UNROLL_LOOPS = False


def optimize(ir_text: str, tm: llvm.TargetMachine, speed_level: int = SPEED_LEVEL,
             unroll: bool = UNROLL_LOOPS) -> llvm.ModuleRef:
    """Parse, verify and run the module pipeline with the target machine's cost model."""
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"generated LLVM IR is invalid: {e}") from None
    pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_interleaving = True
    pto.loop_unrolling = unroll
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def emit_object(ir_text: str, target: Target, jit: bool = False, speed_level: int = SPEED_LEVEL) -> bytes:
    tm = target_machine(target, jit=jit)
    return tm.emit_object(optimize(ir_text, tm, speed_level))


def emit_assembly(ir_text: str, target: Target) -> str:
    tm = target_machine(target)
    return tm.emit_assembly(optimize(ir_text, tm))


@dataclass
class LoadedCode:
    """Keeps the execution engine (and so the code) alive as long as the addresses are used.

    Each load gets its own engine, so the ``_bind`` globals belong to one session.
    """

    engine: llvm.ExecutionEngine
    address: int  # void entry(i8* arena, i8* weights)
    bind: int  # void entry_bind(i8* arena, i8* weights)
    bound: int  # void entry_bound(void)
    start: int = 0  # void entry_start(void): create the worker threads (none at one thread)
    stop: int = 0  # void entry_stop(void): join them
    detach: int = 0  # void entry_detach(void): forget them (a forked child)


_ELF_HEAD = struct.Struct("<16xHHIQQQIHHHHHH")  # Elf64_Ehdr after e_ident
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
SHT_SYMTAB, SHN_UNDEF = 2, 0


def global_symbols(obj: bytes) -> tuple[set[str], set[str]]:
    """The global names an ELF object file defines, and those it uses without defining (LLVM's
    library calls, such as ``__truncdfhf2`` for a double -> half conversion with no instruction).

    Read with ``struct`` (a warm start's loader runs this: LLVM's object-file API made a call per
    section and cost milliseconds); out-of-bounds tables yield no names, never an exception."""
    defined: set[str] = set()
    undefined: set[str] = set()
    if len(obj) < _ELF_HEAD.size or obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:  # ELF64 little-endian
        return defined, undefined
    shoff, shentsize, shnum = (_ELF_HEAD.unpack_from(obj)[i] for i in (5, 10, 11))
    if shentsize != _SECTION.size or shoff + shnum * shentsize > len(obj):
        return defined, undefined
    sections = [_SECTION.unpack_from(obj, shoff + i * shentsize) for i in range(shnum)]
    for _, kind, _, _, off, size, link, _, _, _ in sections:
        if kind != SHT_SYMTAB or link >= shnum or off + size > len(obj):
            continue
        str_off, str_size = sections[link][4], sections[link][5]
        strtab = obj[str_off:str_off + str_size] if str_off + str_size <= len(obj) else b""
        for at in range(off + _SYMBOL.size, off + size - _SYMBOL.size + 1, _SYMBOL.size):  # entry 0 is null
            name_at, info, _, shndx, _, _ = _SYMBOL.unpack_from(obj, at)
            end = strtab.find(b"\0", name_at)
            if info >> 4 in (1, 2) and 0 < name_at < end:  # GLOBAL or WEAK binding, a name inside the table
                (undefined if shndx == SHN_UNDEF else defined).add(strtab[name_at:end].decode(errors="replace"))
    return defined, undefined


def check_resolvable(objs: list[bytes]) -> None:
    """Refuse code that calls a function this process lacks (MCJIT would leave a null call: a crash).
    libc and libm are there (memcpy, exp for f64...); compiler-rt's conversion routines may not be."""
    tables = [global_symbols(o) for o in objs]
    defined = set().union(*(d for d, _ in tables))
    used = set().union(*(u for _, u in tables)) - defined
    missing = sorted(n for n in used if llvm.address_of_symbol(n) is None)
    if missing:
        raise CompileError(f"the native code calls {', '.join(missing)}, which Cuvil does not provide "
                           "(a conversion or math routine this target has no instruction for)")


SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux


def request_amx() -> None:
    """Ask Linux for the AMX tile state of this process (idempotent): without it the first tile
    instruction raises SIGILL."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        raise CompileError(f"AMX tile state exists on x86-64 only, this machine is {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        raise CompileError(f"this CPU or kernel gives no AMX tile state (arch_prctl errno {ctypes.get_errno()})")


def load_object(obj: bytes | list[bytes], entry: str, target: Target) -> LoadedCode:
    """Load host object file(s) into an MCJIT engine of its own (it links them); return the entry points."""
    objs = [obj] if isinstance(obj, bytes) else obj
    got = load_functions(objs, [entry] + [f"{entry}_{n}" for n in ("bind", "bound", "start", "stop", "detach")], target)
    if not all(got.addresses[:3]):  # the pool's functions are absent from hand-written test objects
        raise CompileError(f"entry point {entry!r} not found in the compiled object")
    return LoadedCode(got.engine, *got.addresses)


@dataclass
class LoadedFunctions:
    """Named functions of loaded object file(s); the engine keeps their code alive."""

    engine: llvm.ExecutionEngine
    addresses: tuple[int, ...]


def load_functions(objs: list[bytes], names: list[str], target: Target) -> LoadedFunctions:
    """Load host object files into an engine of their own; the address of each of ``names`` (0: absent)."""
    if target.has("amx-tile"):
        request_amx()
    tm = target_machine(target, jit=True)
    empty = llvm.parse_assembly("")
    empty.triple = tm.triple
    engine = llvm.create_mcjit_compiler(empty, tm)
    check_resolvable(objs)
    for one in objs:
        engine.add_object_file(llvm.ObjectFileRef.from_data(one))
    engine.finalize_object()
    return LoadedFunctions(engine, tuple(engine.get_function_address(n) for n in names))
