"""Native compilation with llvmlite.binding: IR text -> optimized -> object file -> loaded entry.

Kept apart from the compiler (which only builds IR text) so the same object bytes can be cached on
disk, emitted for a foreign ISA, or loaded into this process. Uses LLVM's new pass manager (the
only one llvmlite 0.50 has) with the target machine attached, so the vectorizer costs for the
device's real CPU.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import llvmlite.binding as llvm

from ..compiler.errors import CompileError
from ..compiler.target import Target
from ..devices.detect import resolve_target
from .elf import global_names
from .levels import FULL_LEVEL, SLOTS_LEVEL, SLOTS_PASSES, UNROLL_LOOPS
from .objload import LoadedCode, code_for, entry_names, request_amx

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


def optimize(ir_text: str, tm: llvm.TargetMachine, speed_level: int = FULL_LEVEL,
             unroll: bool = UNROLL_LOOPS) -> llvm.ModuleRef:
    """Parse, verify and run the module pipeline with the target machine's cost model. Each module
    gets an LLVM context of its own: a cold compile runs LLVM on several threads at once (the
    kernel stream's and the caller's), and one LLVMContext must never be used by two threads."""
    try:
        mod = llvm.parse_assembly(ir_text, context=llvm.create_context())
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"generated LLVM IR is invalid: {e}") from None
    if speed_level == SLOTS_LEVEL:
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=0))
        pm = llvm.create_new_module_pass_manager()
        for name in SLOTS_PASSES:
            getattr(pm, f"add_{name}_pass")()
        pm.run(mod, pb)
        return mod
    pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_interleaving = True
    pto.loop_unrolling = unroll
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def emit_object(ir_text: str, target: Target, jit: bool = False, speed_level: int = FULL_LEVEL) -> bytes:
    tm = target_machine(target, jit=jit)
    return tm.emit_object(optimize(ir_text, tm, speed_level))


def emit_assembly(ir_text: str, target: Target) -> str:
    tm = target_machine(target)
    return tm.emit_assembly(optimize(ir_text, tm))


def check_resolvable(objs: list[bytes]) -> None:
    """Refuse code that calls a function this process lacks (MCJIT would leave a null call: a crash).
    libc and libm are there (memcpy, exp for f64...); compiler-rt's conversion routines may not be."""
    tables = [global_names(o) for o in objs]
    defined = set().union(*(d for d, _ in tables))
    used = set().union(*(u for _, u in tables)) - defined
    missing = sorted(n for n in used if llvm.address_of_symbol(n) is None)
    if missing:
        raise CompileError(f"the native code calls {', '.join(missing)}, which Cuvil does not provide "
                           "(a conversion or math routine this target has no instruction for)")


def load_object(obj: bytes | list[bytes], entry: str, target: Target) -> LoadedCode:
    """Load host object file(s) into an MCJIT engine of its own (it links them); return the entry points.
    :func:`.objload.load_object` does this without llvmlite where it can."""
    objs = [obj] if isinstance(obj, bytes) else obj
    got = load_functions(objs, entry_names(entry), target)
    return code_for(got.engine, got.addresses, entry)


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
