"""Compile one float loop with llvmlite for a (triple, cpu, features) and return its assembly.

The loop ``b[i] = a[i] * 2`` is what the vectorizer widens, so the assembly shows which vector
registers a profile's features really give (zmm: 512-bit x86, z0-z31: SVE).
"""

from __future__ import annotations

import re

import llvmlite.binding as llvm

LOOP_IR = """
define void @scale(ptr noalias %a, ptr noalias %b, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %x = load float, ptr %pa
  %y = fmul float %x, 2.0
  store float %y, ptr %pb
  %i1 = add i64 %i, 1
  %c = icmp ult i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""

_READY = False


def compile_loop(triple: str, cpu: str, features: str) -> str:
    global _READY
    if not _READY:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _READY = True
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3)
    module = llvm.parse_assembly(LOOP_IR)
    module.triple = triple
    module.verify()
    builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    builder.getModulePassManager().run(module, builder)
    return tm.emit_assembly(module)


def uses_sve(asm: str) -> bool:
    return bool(re.search(r"\bz\d+\.[bhsd]\b", asm)) or "whilelo" in asm
