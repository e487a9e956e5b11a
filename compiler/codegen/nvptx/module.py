"""Graph -> one NVPTX module of ``ptx_kernel`` functions plus a launch plan (pure ``llvmlite.ir``).

Each node becomes one kernel (identical nodes share one): a grid-stride loop over its output
elements, thread index from ``llvm.nvvm.read.ptx.sreg.*``, every output element computed by one
thread from static shapes (``ops.py`` has the per-op element code). Activations live in one device
arena laid out by the same memory planner as the CPU path; weights are one read-only block in their
canonical layout, uploaded once. Kernel arguments are plain pointers; the plan says, per launch,
which buffer (arena or weights) and byte offset each one is, and the grid to launch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from llvmlite import ir

from ...errors import CompileError
from ...ir.graph import Graph, Node
from ...ops import get_op
from ...target import Target, TargetKind
from .. import irhelpers as h
from ..driver import Prepared, WeightBlock, placement, prepare
from ..lowered import IOSpec
from .context import Loop, OpContext
from .ops import EMITTERS

TRIPLE = "nvptx64-nvidia-cuda"
DATA_LAYOUT = "e-p6:32:32-i64:64-i128:128-v16:16-v32:32-n16:32:64"
BLOCK = 256  # threads per block
MAX_GRID = 65535  # blocks per launch; the grid-stride loop covers the rest


MIN_PTX: dict[str, int] = {"sm_72": 61, "sm_75": 63, "sm_80": 70, "sm_86": 71, "sm_87": 74, "sm_89": 78,
                           "sm_90": 78, "sm_100": 86, "sm_110": 90, "sm_120": 87}
"""Lowest PTX ISA version (``+ptxNN``) LLVM accepts per architecture: below it LLVM aborts the process."""


def gpu_target(name: str, arch: str, features: Sequence[str] = ("+ptx78",)) -> Target:
    """The NVPTX target of a device's GPU (``arch`` like ``sm_87``); checks the PTX version first."""
    ptx = [int(f[4:]) for f in features if re.fullmatch(r"\+ptx\d+", f)]
    need = MIN_PTX.get(arch)
    if need is not None and (not ptx or max(ptx) < need):
        raise CompileError(f"{arch} needs PTX ISA {need // 10}.{need % 10} or newer (feature +ptx{need}), "
                           f"got {', '.join(features) or 'none'}")
    return Target(f"{name}-gpu", TRIPLE, arch, tuple(features), 32, TargetKind.GPU, arch)


@dataclass(frozen=True)
class Arg:
    """A kernel pointer argument: ``space`` is ``"arena"`` or ``"weights"``, at a byte offset."""

    space: str
    offset: int


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: int
    block: int
    args: tuple[Arg, ...]
    node: str


@dataclass(frozen=True)
class GpuProgram:
    """What the CUDA runtime needs: the module, its launches in order, buffers and I/O."""

    llvm_ir: str
    target: Target
    launches: tuple[Launch, ...]
    kernels: tuple[str, ...]
    weights: bytes
    arena_bytes: int
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    batch: int
    fault_offset: int | None = None  # arena offset of the i32 a run-time check sets (OpDef.run_time_check)


def _sreg(b: ir.IRBuilder, name: str) -> ir.Value:
    fn = h.intrinsic(b.module, f"llvm.nvvm.read.ptx.sreg.{name}", h.I32, [])
    return b.zext(b.call(fn, []), h.I64)


def unravel(b: ir.IRBuilder, i: ir.Value, shape: Sequence[int]) -> list[ir.Value]:
    """Row-major multi-index of linear ``i`` over a static shape (divisions by constants)."""
    idx: list[ir.Value] = []
    for d in reversed(shape):
        idx.append(b.urem(i, h.i64(d)) if d != 1 else h.i64(0))
        i = b.udiv(i, h.i64(d)) if d != 1 else i
    return idx[::-1]


def emit_grid_stride(b: ir.IRBuilder, loops: Sequence[Loop]) -> None:
    start = b.add(b.mul(_sreg(b, "ctaid.x"), _sreg(b, "ntid.x")), _sreg(b, "tid.x"))
    stride = b.mul(_sreg(b, "ntid.x"), _sreg(b, "nctaid.x"))
    for n, loop in enumerate(loops):
        total = math.prod(loop.shape)
        if total == 0:
            continue
        pre = b.block
        head, body, done = (b.append_basic_block(f"g{n}.{s}") for s in ("head", "body", "end"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(h.I64, name=f"g{n}")
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_unsigned("<", i, h.i64(total)), body, done)
        b.position_at_end(body)
        loop.body(b, unravel(b, i, loop.shape), i)
        i.add_incoming(b.add(i, stride), b.block)
        b.branch(head)
        b.position_at_end(done)


def _launch_grid(loops: Sequence[Loop]) -> int:
    work = max([math.prod(lp.shape) for lp in loops] or [1])
    return max(1, min(MAX_GRID, -(-work // BLOCK)))


class PtxLowering:
    """One NVPTX module for a prepared graph: one kernel per distinct node, launched in order."""

    def __init__(self, prep: Prepared):
        self.prep, self.ops = prep, EMITTERS
        self.g, self.target, self.plan = prep.graph, prep.target, prep.plan
        graph = self.g
        self.module = ir.Module(name=re.sub(r"\W", "_", graph.name) or "model")
        self.module.triple = TRIPLE
        self.module.data_layout = DATA_LAYOUT
        self.weights = WeightBlock()
        self.kernels: dict[tuple, tuple[str, int]] = {}
        self.launches: list[Launch] = []
        self.fault_offset = prep.fault_offset

    def arg(self, name: str) -> Arg:
        if name in self.g.constants:
            return Arg("weights", self.weights.add((name, None), self.g.constants[name]))
        return Arg("arena", self.plan.offsets[name])

    def run(self) -> None:
        for node in self.g.nodes:
            self.lower_node(node)

    def lower_node(self, node: Node) -> None:
        alias = placement(self.prep, node)
        if alias is None:
            return  # the planner made the view share its input's bytes: nothing to copy
        shared = tuple(a is not None for a in alias)
        in_types = tuple(self.g.types[i] for i in node.inputs)
        out_types = tuple(self.g.types[o] for o in node.outputs)
        key = (node.op, node.attrs, in_types, out_types, shared)
        if key not in self.kernels:
            self.kernels[key] = self.emit_kernel(node, self.ops[node.op], in_types, out_types, shared)
        fname, grid = self.kernels[key]
        args = tuple(self.arg(v) for v in list(node.outputs) + list(node.inputs))
        if get_op(node.op).run_time_check:
            args += (Arg("arena", self.fault_offset),)
        self.launches.append(Launch(fname, grid, BLOCK, args, node.name))

    def emit_kernel(self, node, emit, in_types, out_types, shared) -> tuple[str, int]:
        tys = [h.LLTYPE[t.dtype].as_pointer() for t in list(out_types) + list(in_types)]
        checks = get_op(node.op).run_time_check
        if checks:
            tys.append(h.I32.as_pointer())
        name = f"k{len(self.kernels)}_{node.op}"
        fn = ir.Function(self.module, ir.FunctionType(h.VOID, tys), name=name)
        fn.calling_convention = "ptx_kernel"
        h.set_fn_attrs(fn, ["nounwind"])
        for arg in fn.args:
            arg.add_attribute("nonnull")
            if not any(shared):
                arg.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        n_out = len(out_types)
        n_in = len(in_types)
        ctx = OpContext(b, node.op, dict(node.attrs), in_types, out_types, list(fn.args[n_out:n_out + n_in]),
                        list(fn.args[:n_out]), fn.args[-1] if checks else None)
        loops = emit(ctx)
        emit_grid_stride(b, loops)
        b.ret_void()
        return name, _launch_grid(loops)


def lower_ptx(graph: Graph, target: Target, batch: int = 1, optimize: bool = True) -> GpuProgram:
    """Lower ``graph`` for an NVPTX ``target`` (see :func:`gpu_target`) at a fixed ``batch``."""
    if target.kind is not TargetKind.GPU or not target.triple.startswith("nvptx"):
        raise CompileError(f"lower_ptx needs an NVPTX GPU target, got {target.name} ({target.triple})")
    prep = prepare(graph, target, batch, optimize=optimize, kernels=EMITTERS, backend="GPU")
    low = PtxLowering(prep)
    low.run()
    g = prep.graph
    return GpuProgram(
        llvm_ir=str(low.module), target=target, launches=tuple(low.launches),
        kernels=tuple(n for n, _ in low.kernels.values()), weights=low.weights.tobytes(),
        arena_bytes=max(prep.plan.arena_bytes, h.ALIGN) if low.fault_offset is None else low.fault_offset + h.ALIGN,
        inputs=prep.io(g.inputs), outputs=prep.io(g.outputs), batch=batch, fault_offset=low.fault_offset,
    )
