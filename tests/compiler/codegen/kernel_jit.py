"""Test-only native compilation of emitted kernels (llvmlite.binding, O3) and ctypes calls."""

from __future__ import annotations

import ctypes
import os

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

llvm.initialize_native_target()
llvm.initialize_native_asmprinter()
llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
_KEEP: list = []  # engines must outlive the function pointers handed out


def target_machine(target, opt: int = 3):
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.feature_string, opt=opt, reloc="pic", codemodel="default")


def optimize(module: ir.Module, target) -> tuple:
    tm = target_machine(target)
    mod = llvm.parse_assembly(str(module))
    mod.triple = target.triple
    mod.verify()
    pto = llvm.PipelineTuningOptions(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod, tm


def assembly(module: ir.Module, target) -> str:
    mod, tm = optimize(module, target)
    return tm.emit_assembly(mod)


def jit(module: ir.Module, target, names):
    """Compile for the host and return {name: ctypes function taking 6 float pointers}."""
    mod, tm = optimize(module, target)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    _KEEP.append(engine)
    proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 6)
    return {n: proto(engine.get_function_address(n)) for n in names}


def aligned(a: np.ndarray | None, extra: int = 0) -> np.ndarray | None:
    """A 64-byte aligned float32 copy (with ``extra`` spare elements after it)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a, dtype=np.float32)
    buf = np.empty(a.size + extra + 16, dtype=np.float32)
    off = (-buf.ctypes.data // 4) % 16
    out = buf[off: off + a.size].reshape(a.shape)
    out[...] = a
    return out


def ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


# --- float64 references ---------------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf)(x)


ACT_REF = {
    "none": lambda x, a, b: x,
    "Relu": lambda x, a, b: np.maximum(x, 0),
    "Clip": lambda x, a, b: np.clip(x, a, b),
    "LeakyRelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "Sigmoid": lambda x, a, b: 1 / (1 + np.exp(-x)),
    "Tanh": lambda x, a, b: np.tanh(x),
    "SiLU": lambda x, a, b: x / (1 + np.exp(-x)),
    "HardSwish": lambda x, a, b: x * np.clip(x / 6 + 0.5, 0, 1),
    "HardSigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "Gelu": lambda x, a, b: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    "GeluTanh": lambda x, a, b: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
}
ACT_PARAMS = {"Clip": (-0.5, 0.75), "LeakyRelu": (0.1, 0.0), "HardSigmoid": (0.2, 0.5)}


def conv_ref(X, Wt, bias, strides, pads, dilations, group) -> np.ndarray:
    """Float64 NCHW conv, ONNX semantics (pads top, left, bottom, right)."""
    N, C, H, W = X.shape
    OC, Cg, KH, KW = Wt.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = strides, dilations, pads
    Xp = np.pad(X.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    OH = (H + pt + pb - dh * (KH - 1) - 1) // sh + 1
    OW = (W + pl + pr - dw * (KW - 1) - 1) // sw + 1
    Y = np.zeros((N, OC, OH, OW))
    OCg = OC // group
    for g in range(group):
        for kh in range(KH):
            for kw in range(KW):
                patch = Xp[:, g * Cg:(g + 1) * Cg, kh * dh: kh * dh + sh * (OH - 1) + 1: sh,
                           kw * dw: kw * dw + sw * (OW - 1) + 1: sw]
                Y[:, g * OCg:(g + 1) * OCg] += np.einsum("ncij,oc->noij", patch, Wt[g * OCg:(g + 1) * OCg, :, kh, kw])
    if bias is not None:
        Y += np.asarray(bias, np.float64)[None, :, None, None]
    return Y


def guarded(a: np.ndarray, before: bool = False) -> tuple[np.ndarray, object]:
    """A float32 copy of ``a`` that ends exactly where an inaccessible page begins (reads past it fault);
    ``before``: that starts exactly where one ends (reads before it fault)."""
    import mmap

    page = mmap.PAGESIZE
    nbytes = a.size * 4
    pages = -(-nbytes // page) + 1
    mm = mmap.mmap(-1, pages * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + (0 if before else (pages - 1) * page), page, 0) == 0
    start = page if before else (pages - 1) * page - nbytes
    out = np.frombuffer(mm, dtype=np.float32, count=a.size, offset=start).reshape(a.shape)
    out[...] = a
    return out, mm


def passes_in_child(check) -> bool:
    """Run ``check()`` (True when results match) in a forked child, so a memory fault fails the test
    instead of killing the test runner."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if check() else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
