"""Pre-flight from any machine: compile a model exactly as a device class would, see which vector ISA
its code uses, and run it as that device would (natively when this CPU can, else under qemu).

``cuvil compile --target NAME`` and ``cuvil run --device NAME`` are thin layers over these.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .compiler.atomic_file import atomic_write
from .compiler.ir.graph import Graph
from .native import check_batch
from .devices.isa_report import IsaReport, IsaReportError, from_assembly, from_object
from .devices.profile import check_sve_bits
from .edge_runtime import jit
from .edge_runtime.autotune import Retarget, TuneReport
from .edge_runtime.compile import compile_graph, resolve, runnable_here
from .compiler.codegen.lower import lower


@dataclass(frozen=True)
class CompileReport:
    """What ``compile_for`` produced: sizes, timings, and the ISA actually in the object code."""

    target: str
    triple: str
    cpu: str
    object_bytes: int
    kernels: int
    nodes: int
    arena_bytes: int
    plan_summary: str
    weight_bytes: int
    lower_ms: float
    llvm_ms: float
    isa: IsaReport
    isa_source: str  # "objdump" or "llvm assembly"
    object_path: Path | None = None
    ptx_path: Path | None = None
    ptx_kernels: int = 0
    tuning: TuneReport | None = None  # None: not tuned (turned off, or the code does not run here)


def compile_for(graph: Graph, target: str, batch: int = 1, output: str | os.PathLike | None = None,
                gpu: bool = False, tune: bool | None = None) -> CompileReport:
    """Lower and compile ``graph`` for profile ``target``; write the object (and PTX with ``gpu``).
    ``tune`` (default: the profile's ``tuning.autotune``) times conv candidates where the code runs here."""
    check_batch(graph, batch)
    tgt = resolve(target)
    t0 = time.perf_counter()
    tuner = Retarget() if (tgt.tuning.autotune if tune is None else tune) and runnable_here(tgt) else None
    low = lower(graph, tgt, batch, retarget=tuner)
    t1 = time.perf_counter()
    obj = jit.emit_object(low.llvm_ir, tgt)
    t2 = time.perf_counter()
    try:
        isa, source = from_object(obj, tgt.triple), "objdump"
    except IsaReportError:  # no disassembler here: count over LLVM's assembly of the same module
        isa, source = from_assembly(jit.emit_assembly(low.llvm_ir, tgt), tgt.triple.split("-")[0]), "llvm assembly"
    obj_path = ptx_path = None
    ptx_kernels = 0
    if output is not None:
        obj_path = Path(output)
        _write(obj_path, obj)
    if gpu:
        from .compiler.codegen.nvptx import lower_ptx
        from .edge_runtime.cuda import gpu_target_for

        program = lower_ptx(graph, gpu_target_for(tgt), batch)
        ptx = jit.emit_assembly(program.llvm_ir, program.target)
        ptx_kernels = len(program.kernels)
        ptx_path = (obj_path or Path(f"{_file_name(graph.name)}.o")).with_suffix(f".{program.target.cpu}.ptx")
        _write(ptx_path, ptx.encode())
    return CompileReport(tgt.name, tgt.triple, tgt.cpu, len(obj), low.kernel_count, low.node_count, low.arena_bytes,
                         low.plan.summary(), len(low.weights), (t1 - t0) * 1e3, (t2 - t1) * 1e3, isa, source,
                         obj_path, ptx_path, ptx_kernels, tuner.report if tuner else None)


def _file_name(name: str) -> str:
    """A graph's name as a file name in this folder: it is signed as the author wrote it, and ``/`` or
    ``../x`` wrote the PTX at the filesystem's root or above the current folder."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "model"


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: on a full disk an existing file was truncated, and a FIFO blocked forever."""
    with atomic_write(path) as f:
        f.write(data)


@dataclass(frozen=True)
class DeviceRun:
    outputs: dict[str, np.ndarray]
    emulated: bool
    note: str  # printed by the CLI: says plainly whether the run was emulated


def run_as_device(graph: Graph, inputs: Mapping[str, np.ndarray], device: str, *,
                  sve_vector_bits: int | None = None, content_hash: str | None = None) -> DeviceRun:
    """Outputs of ``graph`` as device class ``device`` computes them: natively when this CPU has
    every feature the device's code uses, otherwise under qemu-user (emulated: never a latency)."""
    if sve_vector_bits is not None:  # the emulator took 0 for "the device's default length"
        check_sve_bits(sve_vector_bits)
    tgt = resolve(device)
    if runnable_here(tgt) and sve_vector_bits is None:
        session = compile_graph(graph, tgt, content_hash=content_hash)
        return DeviceRun(session.run(inputs), False, f"native: {tgt.name} code ({tgt.cpu}) on this CPU")
    from .edge_runtime.emulated import EmulatedModel

    model = EmulatedModel(graph, tgt, content_hash=content_hash)
    (outputs,) = model.run([inputs], sve_vector_bits)
    return DeviceRun(outputs, True, model.banner(sve_vector_bits))
