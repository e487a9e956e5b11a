"""Run a GPU program's kernels on the host CPU, one simulated thread at a time (test-only).

The same module the NVPTX back end compiles is compiled for the host with the ``sreg`` reads
(``tid.x``, ``ctaid.x``, ``ntid.x``, ``nctaid.x``) turned into loads of globals, then the launch
plan is executed exactly as the CUDA runtime does, with a small grid whose threads run in turn.
Every element is owned by one thread, so this order gives the GPU's result; a grid of several
threads checks the grid-stride indexing. It lets the GPU lowering be tested where there is no GPU.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping

import llvmlite.binding as llvm
import numpy as np

from cuvil.compiler.codegen.nvptx import GpuProgram
from cuvil.compiler.errors import RunTimeCheckError
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.session import aligned_empty

SREGS = ("tid.x", "ctaid.x", "ntid.x", "nctaid.x")


def host_ir(program: GpuProgram) -> str:
    text = re.sub(r"^target (datalayout|triple) = .*$", "", program.llvm_ir, flags=re.M)
    text = text.replace("ptx_kernel ", "")
    for s in SREGS:
        sym = s.replace(".", "_")
        text = re.sub(rf'declare i32 @"llvm\.nvvm\.read\.ptx\.sreg\.{re.escape(s)}"\(\)[^\n]*',
                      f'@"sim_{sym}" = global i32 0\ndefine i32 @"read_{sym}"() {{\n  %v = load i32, i32* @"sim_{sym}"\n'
                      f'  ret i32 %v\n}}', text)
        text = text.replace(f'@"llvm.nvvm.read.ptx.sreg.{s}"', f'@"read_{sym}"')
    text, n = re.subn(r'declare i32 @"llvm\.nvvm\.idp4a\.([us])\.([us])"\([^\n]*', _dp4a_definition, text)
    if n:
        text += "\ndeclare i32 @llvm.vector.reduce.add.v4i32(<4 x i32>)\n"
    return text.replace('@"llvm.nvvm.idp4a.', '@"sim_idp4a.') + HALF_FROM_DOUBLE


HALF_FROM_DOUBLE = """
define half @__truncdfhf2(double %x) {
  %f = fptrunc double %x to float
  %h = fptrunc float %f to half
  ret half %h
}
"""
"""compiler-rt's double -> half rounding, which the host's code for a half ``llvm.fma`` calls and
MCJIT cannot resolve: here through float (F16C), a double rounding the GPU does not do."""


def _dp4a_definition(m: re.Match) -> str:
    """``dp4a`` on the host: four byte products (each operand signed or not) added to c."""
    ext = {"s": "sext", "u": "zext"}
    return (f'define i32 @"sim_idp4a.{m[1]}.{m[2]}"(i32 %a, i32 %b, i32 %c) {{\n'
            f"  %va = bitcast i32 %a to <4 x i8>\n  %vb = bitcast i32 %b to <4 x i8>\n"
            f"  %wa = {ext[m[1]]} <4 x i8> %va to <4 x i32>\n  %wb = {ext[m[2]]} <4 x i8> %vb to <4 x i32>\n"
            f"  %p = mul <4 x i32> %wa, %wb\n  %r = call i32 @llvm.vector.reduce.add.v4i32(<4 x i32> %p)\n"
            f"  %s = add i32 %r, %c\n  ret i32 %s\n}}")


class SimulatedGpu:
    """A GpuProgram compiled for the host; :meth:`run` executes its launch plan on the CPU."""

    def __init__(self, program: GpuProgram, threads: int = 3, blocks: int = 2):
        self.program = program
        self.threads, self.blocks = threads, blocks
        target = jit.host_target()
        tm = jit.target_machine(target, jit=True)
        mod = jit.optimize(host_ir(program), tm)
        self.engine = llvm.create_mcjit_compiler(mod, tm)
        self.engine.finalize_object()
        self.regs = {s: ctypes.c_int32.from_address(self.engine.get_global_value_address(f"sim_{s.replace('.', '_')}"))
                     for s in SREGS}
        self.fns = {}
        for launch in program.launches:
            if launch.kernel not in self.fns:
                proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(launch.args))
                self.fns[launch.kernel] = proto(self.engine.get_function_address(launch.kernel))
        self.arena = aligned_empty(program.arena_bytes)
        self.weights = aligned_empty(max(len(program.weights), 64))
        self.weights[:len(program.weights)] = np.frombuffer(program.weights, np.uint8)

    def launch(self, kernel: str, args: list[int]) -> None:
        """One kernel over the simulated grid, threads in turn (args: raw pointers)."""
        self.regs["ntid.x"].value, self.regs["nctaid.x"].value = self.threads, self.blocks
        for block in range(self.blocks):
            for thread in range(self.threads):
                self.regs["ctaid.x"].value, self.regs["tid.x"].value = block, thread
                self.fns[kernel](*args)

    def _view(self, spec) -> np.ndarray:
        return self.arena[spec.offset:spec.offset + spec.nbytes].view(spec.dtype.numpy).reshape(spec.shape)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for spec in self.program.inputs:
            np.copyto(self._view(spec), inputs[spec.name], casting="same_kind")
        base = {"arena": self.arena.ctypes.data, "weights": self.weights.ctypes.data}
        for launch in self.program.launches:
            self.launch(launch.kernel, [base[a.space] + a.offset for a in launch.args])
        at = self.program.fault_offset
        if at is not None and self.arena[at:at + 4].view(np.int32)[0]:  # as the CUDA runtime checks it
            self.arena[at:at + 4] = 0
            raise RunTimeCheckError()
        return {spec.name: self._view(spec).copy() for spec in self.program.outputs}
